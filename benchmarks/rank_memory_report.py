"""The rank_memory section of docs/benchmarks.md and its plot, from the runs benchmarks/rank_memory.py
keeps (results/rank_memory.json) for this tree's code: per phase the peak RssAnon of rank 0 at each
measured depth, the per-layer fit and its value at 24 layers, what the peak holds, and the
collectives' table. Runs of other code kept under other labels are for comparisons (the
measurements log of docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "docs" / "rank_memory_benchmark.png"
PHASES = ("load", "logprobs", "forward", "backward", "optimizer", "export", "between")
CURRENT = "after"  # the label of the runs of this tree's code (`--label`); others are kept for comparisons


STATE_IN = {"backward": ("params", "adam", "grads"), "optimizer": ("params", "adam", "grads")}


def peak(run: dict, phase: str, field: str = "RssAnon") -> float:
    """Rank 0's (the sender's) peak of `field` in `phase` of the last step (load: the load), MiB."""
    return phase_of(run["ranks"][0], phase)["peak"][field]


def phase_of(rank: dict, phase: str) -> dict:
    return rank["load"] if phase == "load" else rank["steps"][-1]["phases"][phase]


def state_in(run: dict, phase: str) -> float:
    """The sharded state a rank holds in `phase`: parameters, Adam moments once the first step
    made them, gradients from the backward to the optimizer step (their full size), MiB."""
    state = run["ranks"][0]["steps"][-1]["state"]
    if phase == "load":
        return state["params"]
    return sum(state[k] if k != "grads" else state["params"] for k in STATE_IN.get(phase, ("params", "adam")))


def fitted(runs: list[dict], key) -> dict[str, float]:
    """`key(run)` split into a per-layer and a fixed part by least squares over the reduced depths,
    and its value at 24 layers, MiB."""
    import numpy as np

    shallow = [r for r in runs if r["layers"] < 24]
    per_layer, fixed = np.polyfit([r["layers"] for r in shallow], [key(r) for r in shallow], 1)
    return {"per_layer": float(per_layer), "fixed": float(fixed), "24": float(fixed + 24 * per_layer)}


def breakdown(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per phase at 24 layers (measured where a 24-layer run exists, else fitted): the higher
    RssAnon peak, the interpreter, the sharded state, the rest, and the RssFile and RssShmem peaks
    (rank 0: the sender), MiB."""
    full = [r for r in runs if r["layers"] == 24]

    def at24(key) -> float:
        return key(full[0]) if full else fitted(runs, key)["24"]

    out = {}
    for phase in PHASES:
        anon = at24(lambda r, p=phase: peak(r, p))
        base = at24(lambda r: r["ranks"][0]["base"]["RssAnon"])
        state = at24(lambda r, p=phase: state_in(r, p))
        out[phase] = {
            "anon": anon,
            "base": base,
            "state": state,
            "rest": anon - base - state,
            "file": at24(lambda r, p=phase: phase_of(r["ranks"][0], p)["peak"]["RssFile"]),
            "shmem": at24(lambda r, p=phase: phase_of(r["ranks"][0], p)["peak"]["RssShmem"]),
        }
    return out


def render(stored: dict) -> str:
    """The section for the runs of this tree's code (label `after`): the peaks per depth with their
    fit, the fit's check against a measured 24-layer run (label `check`), what the peak holds at 24
    layers, the collectives (where measured) and what glibc keeps."""
    current = stored[CURRENT]
    lines = [
        "## Where a trainer rank's memory goes (`benchmarks/rank_memory.py`)",
        "",
        setting(current),
        "",
        *peaks_table(current["runs"]),
        *fit_check(stored.get("check", {"runs": []})["runs"]),
        "",
        *holds_table(current["runs"]),
    ]
    if "collectives" in stored:
        lines += ["", *collectives_table(stored["collectives"])]
    lines += ["", kept_by_glibc(current["runs"]), "", f"![rank memory]({PLOT.name})"]
    return "\n".join(lines)


def setting(current: dict) -> str:
    return (
        f"{current['date']}, {current['machine']}, `MALLOC_ARENA_MAX={current['malloc_arena_max']}`. The "
        "0.5B-shaped experiment's trainer (`experiment=qwen05b_shapes`: FSDP2 on 2 ranks, fp32, packing, "
        "recomputation, logprob chunks of 32, 64-token micro-batches, 4 rows of 22 tokens per rank) with "
        "Qwen2.5-0.5B's shapes at reduced depth (the full 151,936-token vocabulary), and its weight "
        f"sync ({current['runs'][0]['plan']}) to a receiver process. Peak anonymous resident memory "
        "(RssAnon) of rank 0 (the sender) in each phase of the second step (the first makes the Adam "
        "moments), MiB. The 24-layer column is a least-squares fit (fixed + per layer) over the "
        "reduced depths."
    )


def peaks_table(runs: list[dict]) -> list[str]:
    """Per phase: the peak at each measured depth, the per-layer slope and the fit at 24 layers."""
    shallow = [r for r in runs if r["layers"] < 24]
    lines = [
        "| phase | " + " | ".join(f"{r['layers']} layers" for r in shallow) + " | per layer | 24 fitted |",
        "|---|" + "---:|" * (len(shallow) + 2),
    ]
    for phase in PHASES:
        fit = fitted(runs, lambda r, p=phase: peak(r, p))
        cells = [f"{peak(r, phase):.0f}" for r in shallow] + [
            f"{fit['per_layer']:.0f}",
            f"**{fit['24']:.0f}**",
        ]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return lines


def fit_check(check: list[dict]) -> list[str]:
    """How far the fit over the reduced depths lands from a measured 24-layer run of the same code;
    nothing where no such run was kept."""
    full = [r for r in check if r["layers"] == 24]
    if not full:
        return []
    worst = max(abs(fitted(check, lambda r, p=p: peak(r, p))["24"] / peak(full[0], p) - 1) for p in PHASES)
    return [
        "",
        (
            "The fit, checked at full depth (`--label check`): a measured 24-layer run and the same "
            f"code's fit over 4, 8 and 12 layers agree within {worst:.0%} in every phase (measured: "
            + ", ".join(f"{p} {peak(full[0], p):.0f}" for p in PHASES)
            + ")."
        ),
    ]


def holds_table(runs: list[dict]) -> list[str]:
    """What each phase's peak holds at 24 layers: the interpreter, the sharded state, the rest."""
    root = runs[0]["root"]
    lines = [
        (
            "At 24 layers (fitted), each phase's peak split into the interpreter and libraries "
            "(RssAnon before loading), the sharded state counted from its tensors (parameters and Adam "
            "moments; gradients, at their full size, in the backward and the optimizer step) and the rest: "
            f"the gathered root unit (embedding = tied head, {root:.0f} MiB in fp32), its gradient, a "
            "layer's gathered parameters, activations and logits chunks, collective buffers, and free "
            "memory glibc keeps. The rest is also given in root-unit sizes; in the train forward it "
            "includes, from the second micro-batch on, the first one's gradients. RssFile and RssShmem "
            "are rank 0's (the sender's) peaks."
        ),
        "",
        "| phase | RssAnon peak | interpreter | sharded state | rest | rest / root | RssFile | RssShmem |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase, v in breakdown(runs).items():
        lines.append(
            f"| {phase} | {v['anon']:.0f} | {v['base']:.0f} | {v['state']:.0f} | {v['rest']:.0f} | "
            f"{v['rest'] / root:.1f} | {v['file']:.0f} | {v['shmem']:.0f} |"
        )
    return lines


def kept_by_glibc(runs: list[dict]) -> str:
    """The free memory glibc keeps between steps, and the other rank's export."""
    kept = max(rank["steps"][-1]["trimmable"] for run in runs for rank in run["ranks"])
    return (
        f"Free memory glibc keeps between steps, which `malloc_trim(0)` would give back: up to {kept:.0f} "
        "MiB per rank (the trainer worker trims the heap after each sync). In the export the other rank "
        "sends its shards to rank 0 and receives nothing; it peaks there at "
        + ", ".join(f"{phase_of(r['ranks'][1], 'export')['peak']['RssAnon']:.0f}" for r in runs)
        + " MiB at "
        + ", ".join(str(r["layers"]) for r in runs)
        + " layers (rank 0: "
        + ", ".join(f"{peak(r, 'export'):.0f}" for r in runs)
        + ") and holds no shared memory."
    )


def collectives_table(measured: dict) -> list[str]:
    """gloo's collectives vs the in-place ones (`--collectives`): the slower rank's medians, each
    rank's peak."""
    names = list(measured["ranks"][0])
    lines = [
        (
            f"The collectives the trainer uses on gloo, {measured['date']}, same machine: a tensor of the "
            "root unit's size (151,936 x 896 fp32, 519 MiB) on 2 gloo ranks, gloo's own call and the "
            "in-place one alternating, 5 times each; median seconds (the slower rank) and each "
            "rank's peak RssAnon above the call's start (MiB, rank 0 / rank 1; the reduce-scatter's "
            "includes its 519 MiB input). A weight sync's export gathers to the sender alone (rank "
            "0; the other rank sends its shard and receives nothing), against `full_tensor` on both:"
        ),
        "",
        "| collective | gloo s | in place s | in place / gloo | gloo peak | in-place peak |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        gloo = max(r[name]["gloo"] for r in measured["ranks"])
        own = max(r[name]["in_place"] for r in measured["ranks"])
        peaks = [" / ".join(f"{r[name]['peaks'][i]:.0f}" for r in measured["ranks"]) for i in (0, 1)]
        lines.append(f"| {name} | {gloo:.2f} | {own:.2f} | **{own / gloo:.2f}x** | {peaks[0]} | {peaks[1]} |")
    return lines


def plot(stored: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = stored[CURRENT]["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    xs = range(len(PHASES))
    shallow = [r for r in runs if r["layers"] < 24]
    columns = [(f"{r['layers']} layers", [peak(r, p) for p in PHASES]) for r in shallow]
    columns.append(("24 fitted", [fitted(runs, lambda r, p=p: peak(r, p))["24"] for p in PHASES]))
    width = 0.8 / len(columns)
    for i, (label, values) in enumerate(columns):
        left.bar([x - 0.4 + (i + 0.5) * width for x in xs], values, width, label=label)
    left.set_xticks(list(xs), PHASES, rotation=20)
    left.set_ylabel("peak RssAnon per rank, MiB")
    left.set_title("Peak per phase by depth, and fitted at 24 layers")
    left.legend()
    parts = breakdown(runs)
    bottom = [0.0] * len(PHASES)
    for key, name in (("base", "interpreter"), ("state", "sharded state"), ("rest", "rest (root unit, ...)")):
        values = [parts[p][key] for p in PHASES]
        right.bar(list(xs), values, 0.6, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xticks(list(xs), PHASES, rotation=20)
    measured = any(r["layers"] == 24 for r in runs)
    right.set_title(f"24 layers ({'measured' if measured else 'fitted'}): what the peak holds")
    right.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
