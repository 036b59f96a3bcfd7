"""The `roll-device` console script as a user runs it: Hydra overrides, output directory, exit
status and messages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("roll-device")


def _cli(*args, home, timeout=600):
    env = {**os.environ, "ROLL_DEVICE_HOME": str(home)}
    return subprocess.run([str(SCRIPT), *args], check=False, capture_output=True, text=True, env=env, timeout=timeout)


def test_run_writes_into_the_hydra_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = _cli("run", "max_steps=1", "algorithm.kl_coef=0", f"hydra.run.dir={run_dir}", home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(f"run directory: {run_dir}")
    assert "device plan:" in proc.stdout
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    assert "max_steps=1" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert (tmp_path / "tiny-qwen2" / "config.json").exists(), "the tiny model was made on first use"


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "data.prompts_per_step=7", "roles.actor_infer.num_devices=2"], "does not split across 2 actor_infer"),
        (["run", "roles.actor_infer.device=tpu"], "roles.actor_infer.device='tpu'"),
    ],
)
def test_bad_input_exits_2_with_the_reason(tmp_path, args, message):
    proc = _cli(*args, home=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "kind, message",
    [
        ("tpu", "unknown device kind 'tpu': valid kinds are npu, cuda, rocm, cpu (ROLL_DEVICE also takes auto, npu-sim)"),
        ("npu", "ROLL_DEVICE=npu but no usable Ascend NPU: install torch_npu"),
    ],
)
def test_bad_roll_device_is_refused_before_work(tmp_path, kind, message):
    env = {**os.environ, "ROLL_DEVICE": kind, "ROLL_DEVICE_HOME": str(tmp_path)}
    proc = subprocess.run([str(SCRIPT), "run"], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "tiny-qwen2").exists(), "nothing was made"


def test_make_tiny_model(tmp_path):
    proc = _cli("make-tiny-model", str(tmp_path / "m"), "--layers", "1", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["Qwen2ForCausalLM"]


@pytest.mark.slow
def test_the_main_job_as_the_readme_runs_it(tmp_path):
    """`roll-device run` with no arguments: the default 30 steps raise the mean reward."""
    proc = subprocess.run([str(SCRIPT), "run"], check=False, capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={**os.environ, "ROLL_DEVICE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1].split()[2])
    rewards = [json.loads(line)["reward_mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rewards) == 30
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.3
