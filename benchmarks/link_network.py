"""The bridge's links between hosts, each trainer rank on a simulated host with a network of its own
(issue 48's link goal: N links at least 0.8 x N x one link's bandwidth, N = 2, 4).

sync_sharded.py measures the links over this machine's loopback, where N links share its cores and
cannot add bandwidth. Here every trainer rank and the engine run on simulated hosts
(benchmarks/host_network.py: a network namespace each, joined by veth links through a hub), and
the sync is sync_sharded.py's world: N FSDP2 ranks (gloo), each sending its own slices over a gloo
link of its own to one engine process that assembles them in its weights. Three cases per N:
- `cores`: the hosts' NICs unlimited: the links are bound by this machine's cores, as on loopback;
- `network`: each trainer host's NIC sends at most `--rate` (the kernel's token bucket), as a real
  host's link does, with `--rate` low enough that N links together stay below what the cores can
  move: whether the links run at once and add up, as separate hosts' links would;
- `node_links`: as `network`, into two engine hosts: every trainer rank opens a link to each, so
  its NIC carries its slices twice; the bytes both engines got per second against N NICs' worth
  (N x `network`'s one link): whether the trainers' NICs stay busy feeding two engine nodes.

Needs `unshare`, `nsenter`, `ip` and `tc` and a kernel that allows a user and network namespace (the
script re-runs itself in one). Results go to results/link_network.json, the link_network section of
docs/benchmarks.md and docs/link_network_benchmark.png.

    .venv/bin/python benchmarks/link_network.py [--layers 2] [--rounds 3] [--ranks 1 2 4] [--rate 1e9]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section, save_results
from benchmarks.host_network import Hosts, address, enter, private_network
from benchmarks.sync_sharded import CASES, GOALS, engine_seconds, link_efficiency, run_world
from benchmarks.sync_sharded_report import link_verdicts

DOC = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "link_network_benchmark.png"
RESULTS = ROOT / "results" / "link_network.json"
# per case: whether the trainer hosts' NICs are held to `--rate`, the engine ranks' nodes, and the
# case whose one link (one trainer, one engine) its N links are held against
NETWORKS = {
    "cores": (False, CASES["links"], "cores"),  # one engine rank, on a node that is not the trainers'
    "network": (True, CASES["links"], "network"),
    "node_links": (True, CASES["node_links"], "network"),  # two engine ranks, a node each
}


def say(message: str) -> None:
    print(f"[link_network {time.strftime('%H:%M:%S')}] {message}", flush=True)


def world_on_hosts(
    rank: int, trainers: int, model: str, engines: tuple[str, ...], rounds: int, namespaces: list[str]
) -> list[dict]:
    """sync_sharded.py's world with rank `rank` on simulated host `rank` (the engine: the last)."""
    from benchmarks.sync_sharded import world

    enter(namespaces[rank])
    return world(rank, trainers, model, engines, rounds, host=address(rank))


def run_on_hosts(
    model: str, trainers: int, engines: tuple[str, ...], rate: int | None, rounds: int
) -> list[dict]:
    """One world of `trainers` ranks and an engine rank per entry of `engines`, each on a host of
    its own, the trainers' NICs at `rate` bit/s (None: unlimited): every rank's rounds."""
    hosts = Hosts([rate] * trainers + [None] * len(engines))
    try:
        namespaces = [hosts.namespace(i) for i in range(trainers + len(engines))]
        return run_world(
            model, trainers, engines, rounds, namespaces, target="benchmarks.link_network:world_on_hosts"
        )
    finally:
        hosts.close()


def run(model: str, ranks: list[int], rounds: int, rate: int) -> dict:
    """The engine's seconds per sync by network and trainer host count, and its bytes per sync."""
    results: dict = {"seconds": {name: {} for name in NETWORKS}}
    for name, (limited, engines, _) in NETWORKS.items():
        limit = rate if limited else None
        for n in ranks:
            say(
                f"{name}: {n} trainer host(s) -> {len(engines)} engine host(s), NIC {limit or 'unlimited'} bit/s"
            )
            world = run_on_hosts(model, n, engines, limit, rounds)
            results["seconds"][name][n] = engine_seconds(world)
            results["bytes"] = next(r for r in world if r["engine"])["rounds"][0]["nbytes"]
            say(f"  engine s per sync: {[round(x, 3) for x in results['seconds'][name][n]]}")
    return results


def summarize(results: dict) -> dict:
    """Per case, the median seconds and the ratio at each N: the bytes all its engines got per
    second over N x its baseline's one link (for two engine nodes: N NICs' worth)."""
    nbytes, out = results["bytes"], {}
    by_case = {name: {int(n): s for n, s in by_n.items()} for name, by_n in results["seconds"].items()}
    for name, (_, engines, baseline) in NETWORKS.items():
        seconds, one_link = by_case[name], by_case[baseline][min(by_case[baseline])]
        ratio = link_efficiency(nbytes, seconds, one_link)
        out[name] = {
            "seconds": {n: statistics.median(s) for n, s in seconds.items()},
            "ratio": {n: len(engines) * r for n, r in ratio.items()},
        }
    return out


def table(results: dict, s: dict) -> str:
    gb = results["bytes"] / 1e9
    lines = [
        "| trainer hosts' NICs | engine hosts | N trainer hosts | links | sync s | GB/s delivered | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (limited, engines, _) in NETWORKS.items():
        label = f"{results['rate'] / 8e9:.3f} GB/s each" if limited else "unlimited (the cores)"
        for n, seconds in s[name]["seconds"].items():
            lines.append(
                f"| {label} | {len(engines)} | {n} | {n * len(engines)} | {seconds:.3f} | "
                f"{len(engines) * gb / seconds:.3f} | {s[name]['ratio'][n]:.2f} |"
            )
    return "\n".join(lines)


def report(results: dict, s: dict) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rate, goal = results["rate"], GOALS["links"]
    node_links = link_verdicts(s["node_links"]["ratio"], first=1)  # its baseline is another case's
    body = f"""## The bridge's links on simulated hosts (`benchmarks/link_network.py`) - SIMULATED NETWORK

Run {stamp} on `cpu` ({os.cpu_count()} CPU cores, load average {results["load"][0]:.1f} at the start,
{results["load"][1]:.1f} at the end). sync_sharded.py's world of N FSDP2 trainer ranks (gloo) and
one or two engine processes (Qwen2.5-0.5B's shapes with {results["layers"]} decoder layers, fp32,
{results["bytes"] / 1e9:.2f} GB per sync and engine; median of {results["rounds"]} syncs after one
unmeasured), every rank on a simulated host of its own: a network namespace whose one NIC is a veth
link to a hub namespace that routes between hosts (benchmarks/host_network.py). Each trainer rank
sends its own slices over a gloo link of its own to each engine; the slower engine's seconds per
sync. The network is a SIMULATION: the kernel's veth and token-bucket filter on this host, not NICs
and switches; what it shows is whether the links run at once and add up, not a network's speed.

**NICs unlimited** (goal >= {goal} of N x one link's bandwidth): {link_verdicts(s["cores"]["ratio"])}.
Every link's bytes are copied by this host's {os.cpu_count()} cores, through two veths and the hub:
N links share those cores, as on loopback (sync_sharded.py's bridge links).

**Each trainer host's NIC at {rate / 1e9:g} Gbit/s** ({rate / 8e9:.3f} GB/s, the kernel's token bucket
on the host's NIC; the engine hosts' NICs unlimited) (goal >= {goal}):
{link_verdicts(s["network"]["ratio"])}. Here a link is bound by its host's NIC, as between real hosts, and
N links at that rate stay below what the cores move together (the row above): the ratio says
whether the N links send at once.

**Two engine hosts, the trainer hosts' NICs at the same rate** (goal >= {goal} of N NICs' worth):
{node_links}. Every trainer rank opens a link to each engine host, so its NIC carries its slices
twice; the ratio is the bytes both engines got per second over N x the one link (one trainer host,
one engine host) of the paragraph above:
whether N trainer NICs stay busy feeding two engine nodes at once.

{table(results, s)}

![links on simulated hosts](link_network_benchmark.png)
"""
    replace_section(DOC, "link_network", body)


def plot(results: dict, s: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gb = results["bytes"] / 1e9
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = {"cores": "grey", "network": "tab:blue", "node_links": "tab:purple"}
    for name, (_, engines, baseline) in NETWORKS.items():
        seconds, one = s[name]["seconds"], gb / s[baseline]["seconds"][min(s[baseline]["seconds"])]
        ns = list(seconds)
        delivered = [len(engines) * gb / seconds[n] for n in ns]
        axes[0].plot(ns, delivered, "o-", color=colors[name], label=f"{name}: measured")
        axes[0].plot(ns, [n * one for n in ns], ":", color=colors[name], label=f"{name}: N x one link")
    axes[0].set(title="GB/s delivered (simulated hosts)", xlabel="N trainer hosts", ylabel="GB/s (log)")
    axes[0].set_yscale("log")
    axes[0].set_xticks(ns)
    axes[0].legend(fontsize=7)
    bars = [
        (f"{name}\nN={n}", v, colors[name])
        for name in NETWORKS
        for n, v in s[name]["ratio"].items()
        if n > 1 or name == "node_links"
    ]
    axes[1].bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    axes[1].axhline(GOALS["links"], color="red", ls="--", label="goal")
    axes[1].set(title="links vs N x one link", ylabel="ratio", ylim=(0, 1.1))
    axes[1].tick_params(axis="x", labelsize=7)
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rate", type=float, default=1e9, help="each trainer host's NIC, bit/s")
    args = parser.parse_args()
    private_network()
    # the ranks' stores log a warning each half second a wait lasts, and a link held to the NIC's
    # rate waits seconds: only errors from torch's C++ side, so the progress stays readable
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from roll_device.models.qwen_shaped import make_qwen_shaped_model

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="roll-device-link-network-") as directory:
        model = make_qwen_shaped_model(Path(directory) / "model", num_layers=args.layers)
        results = run(str(model), args.ranks, args.rounds, int(args.rate))
    load.append(os.getloadavg()[0])
    results.update(layers=args.layers, rounds=args.rounds, rate=int(args.rate), load=load)
    s = summarize(results)
    say(", ".join(f"{name}={s[name]['ratio']}" for name in NETWORKS))
    save_results(RESULTS, results, s)
    plot(results, s)
    report(results, s)


if __name__ == "__main__":
    main()
