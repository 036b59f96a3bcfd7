"""A new rollout engine is one module, one registration and one YAML file (docs/extending.md):
the toy engine (tests/strategies/toy_engine.py) is read as its own typed section, refused like
any other, and runs a real GRPO step through Ray's workers, which receive it by qualified name."""

import json
import shutil
from pathlib import Path

import pytest

from roll_device.commands.compose import config_dir
from roll_device.commands.run import run_checked
from roll_device.errors import ConfigError
from strategies.base import INFERENCE
from strategies.registry import register_strategy
from tests.configs import run_config
from tests.strategies.toy_engine import ToySettings

TOY_YAML = """\
# the toy engine of docs/extending.md
name: toy
max_model_len: 256
dtype: float32
update_bucket_bytes: 67108864
logprobs_mode: raw_logprobs
capture_sizes: null
greedy_only: false
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The shipped configs with `rollout/toy.yaml` added, and the toy engine registered."""
    configs = tmp_path / "configs"
    shutil.copytree(config_dir(), configs)
    (configs / "rollout" / "toy.yaml").write_text(TOY_YAML)
    monkeypatch.setenv("ROLL_DEVICE_CONFIG_DIR", str(configs))
    monkeypatch.setattr(
        "strategies.registry.STRATEGIES", dict(__import__("strategies.registry").registry.STRATEGIES)
    )
    register_strategy(INFERENCE, "toy", "tests.strategies.toy_engine:ToyEngine")
    return tmp_path


def test_the_toy_engine_has_its_own_typed_section(toy):
    config = run_config("rollout=toy", "rollout.greedy_only=true")
    assert isinstance(config.rollout, ToySettings) and config.rollout.greedy_only is True
    with pytest.raises(
        ConfigError, match=r"rollout.greedy_only='sometimes': input should be a valid boolean"
    ):
        run_config("rollout=toy", "rollout.greedy_only=sometimes")
    with pytest.raises(
        ConfigError, match="unknown key rollout.max_batch_size: the keys here are name, .*, greedy_only"
    ):
        run_config("rollout=toy", "+rollout.max_batch_size=4")


def test_a_grpo_step_runs_on_the_toy_engine(toy, shared_cluster):
    config = run_config(*shared_cluster, "rollout=toy", "max_steps=1")
    run_dir = run_checked(config, toy / "run")
    (record,) = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["weights_version"] == 1
    assert record["rollout_vs_train_logprob_gap"] < 0.05, "the toy engine's logprobs are the trainer's"
