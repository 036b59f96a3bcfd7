"""A LoRA run end to end: `roll-device run trainer.lora.rank=8` on the tiny model through vLLM on
the CPU syncs its adapters alone from the first step (by default); raises the reward, its KL taken
against the base, with no reference worker, and its last checkpoint resumes and exports as an
adapter (slow)."""

import json
from pathlib import Path

import pytest

from roll_device.commands.export import export_command
from roll_device.commands.run import run_checked
from tests.configs import run_config


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_lora_runs_syncs_carry_its_adapters_alone_from_the_first(tmp_path, shared_cluster, tiny_model_path):
    config = run_config(*shared_cluster, "trainer.lora.rank=8", "max_steps=2", "save_every=0")
    synced = [r["sync_bytes"] for r in _records(run_checked(config, tmp_path / "run"))]
    model_bytes = (Path(tiny_model_path) / "model.safetensors").stat().st_size
    assert synced[0] == synced[1] < model_bytes / 5, (synced, model_bytes)


@pytest.mark.slow
def test_a_lora_run_raises_the_reward_resumes_and_exports(tmp_path, shared_cluster):
    overrides = (*shared_cluster, "trainer.lora.rank=8", "save_every=0")
    run_dir = run_checked(run_config(*overrides, "max_steps=20"), tmp_path / "run")
    rewards = [r["reward_mean"] for r in _records(run_dir)]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.03, f"reward did not rise: {rewards}"
    assert any(r["kl"] != 0 for r in _records(run_dir))  # the KL to the base is on
    run_checked(run_config(*overrides, "max_steps=21", "resume=true"), run_dir)
    assert [r["step"] for r in _records(run_dir)][-1] == 21
    assert export_command(str(run_dir), str(tmp_path / "adapter")) == 0
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
