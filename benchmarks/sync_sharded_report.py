"""sync_sharded.py's section of docs/benchmarks.md, its tables and its plot, from a run's results and
summary (`summarize`)."""

from __future__ import annotations

import datetime
import os

from benchmarks.doc_sections import replace_section
from benchmarks.sync_sharded import BUCKET_BYTES, CASES, GOALS, ROOT

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "sync_sharded_benchmark.png"


def verdict(value: float, goal: float, at_most: bool = False) -> str:
    met = value <= goal if at_most else value >= goal
    return f"**{value:.2f}** ({'meets' if met else 'misses'} the goal {'<=' if at_most else '>='} {goal})"


def link_verdicts(ratios: dict[int, float], first: int = 2) -> str:
    """Each N from `first` on of a links case against its goal (N = 1 is the baseline where one
    link is the measure)."""
    return ", ".join(f"N={n} {verdict(v, GOALS['links'])}" for n, v in ratios.items() if n >= first)


def tables(results: dict, s: dict) -> str:
    gb = results["bytes"] / 1e9
    lines = [
        "| trainer ranks | sync s | vs 1 rank | worst rank: peak extra MB | its shard + 2 buckets MB | ratio |"
    ]
    lines.append("|---|---|---|---|---|---|")
    for n, seconds in s["seconds"].items():
        w = s["worst"][n]
        bound = (w["shard_bytes"] + 2 * BUCKET_BYTES) / 2**20
        lines.append(
            f"| {n} | {seconds:.3f} ({gb / seconds:.2f} GB/s) | {s['scaling'][n]:.2f} | "
            f"{w['peak_extra'] / 2**20:.0f} | {bound:.0f} | {s['memory'][n]:.2f} |"
        )
    t = s["transport_s"]
    lines += ["", "| same-host transport | s | vs memcpy |", "|---|---|---|"]
    for mode, label in (
        ("two_copy", "two-copy (packed, copied out)"),
        ("one_copy", "one-copy (read in place)"),
    ):
        lines.append(
            f"| memcpy of the same bytes, right before (engine) | {t['memcpy_' + mode]:.3f} | 1.00 |"
        )
        lines.append(f"| {label} | {t[mode]:.3f} | {s[mode]:.2f} |")
    if s["links"]:
        lines += [
            "",
            "| bridge links (gloo, simulated nodes) | sync s | GB/s | vs N x one link |",
            "|---|---|---|---|",
        ]
        for n, seconds in s["link_seconds"].items():
            lines.append(f"| {n} | {seconds:.3f} | {gb / seconds:.2f} | {s['links'][n]:.2f} |")
    if s["node_links"]:
        engines = len(CASES["node_links"])
        lines += [
            "",
            f"| node links (gloo, simulated nodes on one host): trainer ranks x {engines} engine nodes "
            + "| links | sync s | GB/s delivered | vs links x one link |",
            "|---|---|---|---|---|",
        ]
        for n, seconds in s["node_link_seconds"].items():
            lines.append(
                f"| {n} x {engines} | {n * engines} | {seconds:.3f} | {engines * gb / seconds:.2f} | "
                f"{s['node_links'][n]:.2f} |"
            )
    return "\n".join(lines)


def _transport(s: dict) -> str:
    """The same-host transport's paragraph."""
    return f"""**Same-host shared-memory transport vs memcpy of the same bytes** (goal >= {GOALS["one_copy"]} for
one-copy): one-copy {verdict(s["one_copy"], GOALS["one_copy"])}, two-copy {s["two_copy"]:.2f}. One
sender process and the engine process; per round, a two-copy sync (the sender's ordinary tensors:
packed into the slots, the engine copies out of them) and a one-copy sync (the sender's tensors in
shared memory: the engine's copy into its weights is the only one), each right after a memcpy of
the same bytes in the engine process (the other end idle); the ratio is the median over rounds of
each sync's against its own memcpy (the machine's load moves both); the table gives each column's
median seconds. Where the one-copy sync's time goes (profiled in both processes): the engine's
`copy_` of each tensor out of the trainer's segments is 93-96% of it (the headers, maps and
reports the rest), and the same copies replayed outside a sync take as long; one `copy_` per tensor
is one OpenMP parallel region, and on these 2 shared cores those regions lose to the single
region of the flat memcpy when other work runs (on a quiet machine,
and under load with `OMP_WAIT_POLICY=PASSIVE`, the one-copy sync measured 0.92-1.02 of memcpy in
the same rounds: docs/benchmarks.md's Measurements log)."""


def report(results: dict, s: dict) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    most = max(s["scaling"])
    links = link_verdicts(s["links"])
    node_links = ", ".join(f"{n} x 2 {verdict(v, GOALS['links'])}" for n, v in s["node_links"].items())
    body = f"""## The sharded sync and the one-copy path (`benchmarks/sync_sharded.py`)

Run {stamp} on `cpu` ({os.cpu_count()} CPU cores, load average {results["load"][0]:.1f} at the start,
{results["load"][1]:.1f} at the end; other work shared the machine). Model: Qwen2.5-0.5B's shapes with
{results["layers"]} decoder layers, fp32, {results["bytes"] / 1e9:.2f} GB (the tied embedding is most of
it); median over {results["rounds"]} rounds after one unmeasured (the first
maps the trainer's segments and makes the slots a large tensor needs); buckets of {BUCKET_BYTES >> 20} MiB. Each world is N FSDP2
trainer ranks (gloo) and one engine process that copies what it receives into its own weights, all
on this host; every process computes with {results.get("threads", "?")} intra-op threads, one per logical core
of the host (`THREADS`, set for every rank; torch's default here). The engine's weights are in memory of their own at
64-byte boundaries, as the HF engine now holds them (not at the safetensors file's offsets).

**Sync time, {most} trainer ranks vs 1** (goal <= {GOALS["scaling"]}): {verdict(s["scaling"][most], GOALS["scaling"], True)}.
Each rank sends its own slices over a link of its own, its tensors kept in shared memory; the engine
reads them there and assembles each tensor cut across ranks straight into its weight (one copy per
byte, whatever N). **Peak extra memory per rank vs its shard plus two buckets** (goal <= 1; the
worst rank and round at each N; resident memory above the level before the sync, the slots made
at connect not counted): {", ".join(f"N={n} {v:.2f}" for n, v in s["memory"].items())}.

{_transport(s)}

**Bridge links** (goal >= {GOALS["links"]} of N x one link's bandwidth): {links or "not measured"}.
The bridge's between-host transport (one gloo broadcast per link from its trainer rank to the
engine, on a simulated node of its own: the placement's node ids differ), all on this host, CPU on
both ends: the
cross-kind part of the bridge (staging to and from a device) is not in it. All N links and the
engine share this machine's {os.cpu_count()} cores and loopback, so N links cannot add bandwidth here
beyond what the cores give; separate hosts each bring their own (link_network.py: the same links
on simulated hosts, each trainer host's NIC at a set rate, add up).

**Node links, simulated nodes on one host** (goal >= {GOALS["links"]} of the links' count x one
link's bandwidth): {node_links or "not measured"}. N trainer ranks into two engine processes, each
on a simulated node of its own (neither the trainers'): every trainer rank opens one gloo link per
engine node, 2N links sending at once, each engine getting the whole model; the bandwidth delivered
(both engines' bytes over the sync, the slower engine's seconds) against 2N x the one link of the
row above. The same {os.cpu_count()} cores carry all 2N links, the N trainers and both engines:
here the links share the cores, they do not add bandwidth (load average above); link_network.py
runs the same two engine nodes on simulated hosts, each trainer host's NIC at a set rate.

{tables(results, s)}

![sharded sync](sync_sharded_benchmark.png)
"""
    replace_section(DOC, "sync_sharded", body)


def plot(results: dict, s: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    ranks = list(s["seconds"])
    axes[0].bar([str(n) for n in ranks], [s["seconds"][n] for n in ranks])
    axes[0].axhline(s["seconds"][min(ranks)] * GOALS["scaling"], color="red", ls="--", label="goal")
    axes[0].set(title="sync s by trainer ranks (shm)", xlabel="trainer ranks", ylabel="s")
    axes[0].legend()
    modes = ["two_copy", "one_copy"]
    axes[1].bar(["two-copy", "one-copy"], [s[m] for m in modes], color=["grey", "tab:green"])
    axes[1].axhline(GOALS["one_copy"], color="red", ls="--")
    axes[1].set(title="same-host transport vs memcpy", ylabel="memcpy s / sync s", ylim=(0, 1.1))
    bars = [(f"{n}", s["links"][n], "tab:orange") for n in s["links"]]
    bars += [(f"{n}x2", s["node_links"][n], "tab:purple") for n in s["node_links"]]
    axes[2].bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    axes[2].axhline(GOALS["links"], color="red", ls="--")
    axes[2].set(
        title="gloo links vs links x one\n(simulated nodes on one host)",
        xlabel="trainer ranks (x engine nodes)",
        ylabel="ratio",
        ylim=(0, 1.1),
    )
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
