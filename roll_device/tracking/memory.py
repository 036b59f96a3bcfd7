"""Memory per role and phase: what a worker reads after each phase (`read_memory`: the device
memory its tensors use and the caching allocator reserves, through its platform, and the
process's resident host memory), the metrics keys the run records them under
(`memory/<role>/<phase>/<reading>_mib`, the largest over the role's workers), and `memory.png`.

On the CPU the device is the host: device memory used and reserved are the process's resident
set, as the CPU platform reports them.
"""

from __future__ import annotations

from pathlib import Path

from roll_device.platforms import Platform, process_status

MIB = 1 << 20
READINGS = ("device_used", "device_reserved", "host_rss")
PREFIX = "memory/"

Reading = dict[str, int]  # a name of READINGS -> bytes


def read_memory(platform: Platform) -> Reading:
    """This process's memory now, on `platform`'s current device and on the host."""
    return {
        "device_used": platform.memory_allocated(),
        "device_reserved": platform.memory.memory_reserved(),
        "host_rss": process_status("VmRSS")["VmRSS"],
    }


def larger(a: Reading | None, b: Reading) -> Reading:
    """Each reading's larger value of `a` and `b` (`b` where there is no `a`)."""
    return b if a is None else {key: max(a[key], b[key]) for key in b}


def memory_metrics(reports: dict[str, list[dict[str, Reading]]]) -> dict[str, float]:
    """The record's memory keys from each role's workers' reports (phase -> reading, one per
    worker): the largest over the workers, in MiB."""
    metrics = {}
    for role, workers in reports.items():
        peaks: dict[str, Reading] = {}
        for phases in workers:
            for phase, reading in phases.items():
                peaks[phase] = larger(peaks.get(phase), reading)
        for phase, reading in peaks.items():
            for key in READINGS:
                metrics[f"{PREFIX}{role}/{phase}/{key}_mib"] = round(reading[key] / MIB, 3)
    return metrics


def plot_memory(records: list[dict], path: Path, title: str) -> Path:
    """`memory.png`: device memory used and host RSS of each role and phase over the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    for ax, reading in zip(axes, ("device_used", "host_rss")):
        suffix = f"/{reading}_mib"
        keys = sorted({k for r in records for k in r if k.startswith(PREFIX) and k.endswith(suffix)})
        for key in keys:
            steps = [r["step"] for r in records if key in r]
            ax.plot(
                steps,
                [r[key] for r in records if key in r],
                marker=".",
                label=key[len(PREFIX) : -len(suffix)],
            )
        ax.set(title=f"{reading.replace('_', ' ')} (MiB, after each phase)", xlabel="step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if keys:
            ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
