"""`experiment=qwen05b_shapes` with the tiny model: GRPO steps through `roll-device run` with the
FSDP trainer's features for real sizes all on (2 trainer ranks, packing, recomputation, chunked
logprobs, a token budget; the HF rollout), on the CPU and on 2 simulated NPUs of the sim cluster.
The trainer's packed, chunked logprobs of the rollout's samples agree with the rollout's own, the
weights reach the rollout every step, and the entropy metric is reported. Slow: two Ray runs."""

from __future__ import annotations

import json
import math

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


def _run(tmp_path, *overrides: str) -> tuple[list[dict], list[dict]]:
    seen: dict = {}

    def on_step(record, roles):
        seen["infos"] = roles.groups["actor_train"].infos

    cfg = run_config(
        "experiment=qwen05b_shapes",
        "model.path=null",
        "max_steps=2",
        *overrides,
    )
    run_dir = run_checked(cfg, tmp_path / "run", on_step=on_step)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return records, seen["infos"]


def _check(records: list[dict]) -> None:
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["weights_version"] == r["step"] for r in records), "the rollout got each step's weights"
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "packed chunked logprobs agree"
    assert all(math.isfinite(r["entropy"]) and r["entropy"] > 0 for r in records)


@pytest.mark.slow
def test_all_features_on_two_cpu_ranks(tmp_path):
    cfg = run_config("experiment=qwen05b_shapes")
    assert (cfg.trainer.packing, cfg.trainer.recompute) == (True, True)
    assert cfg.trainer.logprob_chunk_tokens and cfg.trainer.max_tokens_per_micro_batch
    records, infos = _run(tmp_path)
    _check(records)
    assert [i["device"] for i in infos] == ["cpu", "cpu"]


@pytest.mark.slow
def test_all_features_on_two_simulated_npus(tmp_path):
    """SIMULATED: the trainer ranks on the sim cluster's NPU node, the rollout on the CPU head."""
    records, infos = _run(
        tmp_path, "cluster=sim", "roles.actor_train.device=npu", "roles.actor_infer.device=cpu"
    )
    _check(records)
    assert [(i["platform"], i["device"]) for i in infos] == [("npu (simulated)", "npu:0")] * 2
