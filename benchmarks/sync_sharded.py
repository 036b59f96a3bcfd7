"""The sharded weight sync and the one-copy shared-memory path, measured in one run (issue 48).

1. Ranks: an FSDP2 trainer of 1, 2 and 4 CPU ranks (gloo) at one model size syncs into one engine
   on the same host, each rank over a link of its own (roll_device/comm/sharded.py), its tensors
   kept in shared memory and assembled straight into the engine's weights (the one-copy path, as
   a run takes it). Sync seconds per rank count (goal: 4 ranks within 1.3x of 1) and each rank's
   peak extra resident memory during the sync against its shard plus two buckets.
2. The same-host shared-memory transport: one sender's tensors into an engine process that copies
   each into its weights, two-copy (packed into the slots, then copied out) and one-copy (the
   sender's tensors in shared memory, read in place), against one memcpy of the same bytes in the
   engine process, in the same rounds (goal: one-copy at least 0.8).
3. Links: the bridge's between-host links (gloo; the engine on a node of its own, CPU on both ends)
   of 1, 2 and 4 trainer ranks, all over this host's loopback: the aggregate bandwidth against N x
   one link's (goal: at least 0.8 for N = 2, 4; link_network.py gives each rank a host's network).
4. Node links: N trainer ranks into two engine ranks, each on a simulated node of its own (neither
   the trainers'): every trainer rank opens one gloo link per engine node, 2N links at once; the
   bandwidth delivered (both engines' bytes) against 2N x one link's.

Each world is N trainer ranks plus its engine ranks (the last), spawned processes in one gloo world
(strategies/training/local_ranks.py); FSDP2 shards over the trainer ranks' group alone. The model:
Qwen2.5-0.5B's shapes with `--layers` decoder layers, fp32. Results go to results/sync_sharded.json,
the sync_sharded section of docs/benchmarks.md and docs/sync_sharded_benchmark.png.

    .venv/bin/python benchmarks/sync_sharded.py [--layers 2] [--rounds 3] [--ranks 1 2 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import save_results

RESULTS = ROOT / "results" / "sync_sharded.json"
BUCKET_BYTES = 64 << 20
GOALS = {"scaling": 1.3, "one_copy": 0.8, "links": 0.8}
TRAINER_NODE = "node-0"  # every trainer rank's simulated node
WORLD = "benchmarks.sync_sharded:world"  # what every rank of a world runs
THREADS = {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}  # every process: one per logical core
CASES = {  # the engine ranks' nodes of each case of worlds by trainer rank count
    "ranks": ("node-0",),  # the trainers' own: shared memory, the one-copy path
    "links": ("node-1",),  # another: a gloo link per trainer rank
    "node_links": ("node-1", "node-2"),  # two others: a gloo link per trainer rank and node
}


def say(message: str) -> None:
    print(f"[sync_sharded {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- ratios (pure: tested on small inputs) -------------------------------------------------------
def scaling(seconds: dict[int, list[float]]) -> dict[int, float]:
    """Median sync seconds at each rank count over the median at the fewest ranks."""
    base = statistics.median(seconds[min(seconds)])
    return {n: statistics.median(s) / base for n, s in sorted(seconds.items())}


def vs_memcpy(pairs: list[tuple[float, float]]) -> float:
    """The median over rounds of memcpy seconds / sync seconds, each pair measured together."""
    return statistics.median(memcpy / sync for memcpy, sync in pairs)


def link_efficiency(nbytes: int, seconds: dict[int, list[float]], one_link: list[float]) -> dict[int, float]:
    """Aggregate bandwidth of N trainer ranks' links over N x one link's (`one_link`: one rank's
    syncs over one link; the median sync of each). With M engine nodes each engine gets the whole
    `nbytes` over N links of its own: M x the bytes over M x N links, the same ratio."""
    one = nbytes / statistics.median(one_link)
    return {n: nbytes / statistics.median(s) / (n * one) for n, s in sorted(seconds.items())}


def memory_bound(peak_extra: int, shard_bytes: int, bucket_bytes: int) -> float:
    """A rank's peak extra memory over its shard plus two buckets (at most 1: within the goal)."""
    return peak_extra / (shard_bytes + 2 * bucket_bytes)


# ---- one world: N trainer ranks and an engine rank ------------------------------------------------
def _resident(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _trainer(model_path: str, trainers: int, group, one_copy: bool):
    """This rank's FSDP2 shards of the model (its tensors in shared memory where `one_copy`)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from roll_device.comm.segments import keep_in_shared_memory
    from roll_device.comm.shards import local_shards
    from strategies.tied_weights import state_once

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = list(local_shards(state_once(model).items()))
    if one_copy:
        keep_in_shared_memory(t for _, t, _ in local)
    return model, local


def _options():
    from roll_device.comm import WeightSyncOptions
    from roll_device.settings import read_section

    values = {"path": "bridge", "bucket_bytes": BUCKET_BYTES, "verify": False, "timeout_s": 300}
    return read_section(WeightSyncOptions, values, "weight_sync")


def _gather(value) -> list:
    import torch.distributed as dist

    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _engine_model(model_path: str):
    """The engine's model as the HF engine holds it: each tensor in memory of its own, at a 64-byte
    boundary (not at its offset in the safetensors file's mapping)."""
    import torch
    from transformers import AutoModelForCausalLM

    from roll_device.comm.buffers import own_aligned_memory

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    own_aligned_memory(model)
    return model


def _engine_receiver(model_path: str, endpoints: list, rank: int, timeout_s: float):
    import roll_device as rd
    from roll_device.comm.sharded import ShardedReceiver

    model = _engine_model(model_path)
    state = dict(model.state_dict())
    receiver = ShardedReceiver(endpoints, rank, rd.get_platform("cpu"), timeout_s, targets=state)
    return receiver, state


def _load(state: dict):
    def apply(named) -> None:
        for name, tensor in named:
            state[name].copy_(tensor)  # a no-op for a tensor assembled in place

    return apply


def world(rank: int, trainers: int, model_path: str, engines: tuple[str, ...], rounds: int, host="127.0.0.1"):
    """Rank `rank` of N trainers + an engine rank per entry of `engines` (its node): `rounds`
    syncs; every rank's rounds, in rank order. A trainer rank's store listens at `host`."""
    import torch.distributed as dist

    import roll_device as rd
    from roll_device.comm import plan_sync
    from roll_device.comm.sharded import ShardedSender

    group = dist.new_group(list(range(trainers)))  # every rank takes part in making it
    engine = rank >= trainers
    same_node = set(engines) == {TRAINER_NODE}
    local = None if engine else _trainer(model_path, trainers, group, one_copy=same_node)[1]
    layouts = _gather(None if engine else {name: s for name, _, s in local})[:trainers]
    plan = plan_sync("cpu", "cpu", colocated=False, same_node=same_node, forced="bridge")
    sending = (plan, rd.get_platform("cpu"), rank, layouts, engines, _options(), TRAINER_NODE, host)
    sender = None if engine else ShardedSender(*sending)
    endpoints = _gather(None if engine else sender.endpoint)[:trainers]
    side = _engine_receiver(model_path, endpoints, rank - trainers + 1, 300) if engine else None
    (side[0] if engine else sender).connect()
    measured = []
    for version in range(1, rounds + 2):  # the first maps the segments and makes slots: not measured
        dist.barrier()
        if engine:
            stats = side[0].receive(_load(side[1]))
            measured.append({"seconds": stats.seconds, "nbytes": stats.nbytes})
        else:
            measured.append(_send_measured(sender, local, version))
    (side[0] if engine else sender).close()
    return _gather({"rank": rank, "engine": engine, "rounds": measured[1:]})


def _send_measured(sender, local: list, version: int) -> dict:
    """One sync from this rank, with its peak resident memory above where it stood before."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _resident("VmRSS")
    stats = sender.send(((name, t) for name, t, _ in local), version=version)
    return {
        "seconds": stats.seconds,
        "nbytes": stats.nbytes,
        "shard_bytes": sum(t.numel() * t.element_size() for _, t, _ in local),
        "peak_extra": _resident("VmHWM") - before,
    }


# ---- the same-host transport: two-copy, one-copy, memcpy ------------------------------------------
def _flat_pair(nbytes: int):
    import torch

    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    dst.copy_(src)  # every page touched before the first measured copy
    return src, dst


def _memcpy_seconds(pair) -> float:
    start = time.perf_counter()
    pair[1].copy_(pair[0])
    return time.perf_counter() - start


MODES = ("memcpy_two_copy", "two_copy", "memcpy_one_copy", "one_copy")  # a round, in order


def transport(rank: int, model_path: str, rounds: int) -> list[dict]:
    """Rank 0 sends, rank 1 (the engine) copies into its weights; per round, in the engine: a
    memcpy of the bytes and a two-copy sync, a memcpy and a one-copy sync. The engine's rounds."""
    import torch
    import torch.distributed as dist

    import roll_device as rd
    from roll_device.comm import WeightReceiver, WeightSender, plan_sync
    from roll_device.comm.segments import keep_in_shared_memory
    from strategies.tied_weights import state_once

    model = _engine_model(model_path)
    state = {name: t.detach() for name, t in state_once(model).items()}
    plan = plan_sync("cpu", "cpu", colocated=False, same_node=True, forced="bridge")
    if rank == 0:
        shared = {name: t.clone() for name, t in state.items()}
        keep_in_shared_memory(shared.values())
        sender = WeightSender(plan, rd.get_platform("cpu"), 1, _options())
    endpoint = _gather(sender.endpoint if rank == 0 else None)[0]
    if rank == 1:
        receiver = WeightReceiver(endpoint, 1, rd.get_platform("cpu"), 300, reads_in_place=True)
        pair = _flat_pair(sum(t.numel() * t.element_size() for t in state.values()))
    (sender if rank == 0 else receiver).connect()
    measured = []
    for version in range(1, rounds + 2):  # the first maps the segments and makes slots: not measured
        row = {"threads": torch.get_num_threads()}
        for mode in MODES:  # each alone: the other end waits
            dist.barrier()
            memcpy = mode.startswith("memcpy")
            if rank == 1:
                row[mode] = _memcpy_seconds(pair) if memcpy else receiver.receive(_load(state)).seconds
            elif not memcpy:
                tensors = state if mode == "two_copy" else shared
                sender.send(tensors.items(), version=2 * version - (mode == "two_copy"))
        measured.append(row)
    (sender if rank == 0 else receiver).close()
    return measured[1:]


# ---- the run, its summary, section and plot --------------------------------------------------------
def engine_seconds(ranks: list[dict]) -> list[float]:
    """The sync seconds per round, from one world's ranks: its slowest engine's."""
    engines = [r["rounds"] for r in ranks if r["engine"]]
    return [max(row["seconds"] for row in rows) for rows in zip(*engines, strict=True)]


def worst_rank(ranks: list[dict]) -> dict:
    """The trainer rank and round with the largest peak extra memory over its bound."""
    rows = [row for r in ranks if not r["engine"] for row in r["rounds"]]
    return max(rows, key=lambda row: memory_bound(row["peak_extra"], row["shard_bytes"], BUCKET_BYTES))


def summarize(results: dict) -> dict:
    ranks = {int(n): engine_seconds(w) for n, w in results["ranks"].items()}
    links = {int(n): engine_seconds(w) for n, w in results["links"].items()}
    node_links = {int(n): engine_seconds(w) for n, w in results["node_links"].items()}
    rows = results["transport"]
    worst = {int(n): worst_rank(w) for n, w in results["ranks"].items()}
    return {
        "seconds": {n: statistics.median(s) for n, s in ranks.items()},
        "scaling": scaling(ranks),
        "memory": {
            n: memory_bound(w["peak_extra"], w["shard_bytes"], BUCKET_BYTES) for n, w in worst.items()
        },
        "worst": worst,
        "one_copy": vs_memcpy([(r["memcpy_one_copy"], r["one_copy"]) for r in rows]),
        "two_copy": vs_memcpy([(r["memcpy_two_copy"], r["two_copy"]) for r in rows]),
        "transport_s": {m: statistics.median(r[m] for r in rows) for m in MODES},
        "link_seconds": {n: statistics.median(s) for n, s in links.items()},
        "links": link_efficiency(results["bytes"], links, links[1]) if 1 in links else {},
        "node_link_seconds": {n: statistics.median(s) for n, s in node_links.items()},
        "node_links": link_efficiency(results["bytes"], node_links, links[1]) if 1 in links else {},
    }


def run_world(model: str, trainers: int, engines: tuple[str, ...], rounds: int, *extra, target=WORLD):
    """Every rank's rounds of one world: `target` (`world`, or one that calls it, taking `extra`)."""
    from strategies.training.local_ranks import run_ranks

    world = (target, trainers + len(engines), trainers, model, engines, rounds, *extra)
    return run_ranks(*world, env=THREADS, timeout=1800)[0]


def run(model: str, ranks: list[int], rounds: int) -> dict:
    from strategies.training.local_ranks import run_ranks

    results: dict = {key: {} for key in CASES}
    for key, engines in CASES.items():
        for n in ranks:
            say(f"{key}: {n} trainer rank(s) on {TRAINER_NODE} + engines on {list(engines)}")
            results[key][n] = run_world(model, n, engines, rounds)
            say(f"  engine s per sync: {[round(x, 3) for x in engine_seconds(results[key][n])]}")
    say("same-host transport: two-copy, one-copy, memcpy")
    results["transport"] = run_ranks(
        "benchmarks.sync_sharded:transport", 2, model, rounds, env=THREADS, timeout=1800
    )[1]
    say(f"  {results['transport']}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    from roll_device.models.qwen_shaped import make_qwen_shaped_model

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="roll-device-sync-sharded-") as directory:
        model = make_qwen_shaped_model(Path(directory) / "model", num_layers=args.layers)
        results = run(str(model), args.ranks, args.rounds)
    load.append(os.getloadavg()[0])
    results.update(layers=args.layers, rounds=args.rounds, load=load)
    results["bytes"] = results["ranks"][min(args.ranks)][-1]["rounds"][0]["nbytes"]  # the engine's
    results["threads"] = results["transport"][0]["threads"]
    s = summarize(results)
    say(
        f"scaling={s['scaling']} memory={s['memory']} one_copy={s['one_copy']:.2f} two_copy={s['two_copy']:.2f}"
    )
    say(f"links={s['links']} node_links={s['node_links']}")
    from benchmarks.sync_sharded_report import plot, report

    save_results(RESULTS, results, s)
    report(results, s)
    plot(results, s)


if __name__ == "__main__":
    main()
