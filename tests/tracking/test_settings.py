"""`logger`, `tracking` and `profile` read through the gate: the defaults, and each refusal in one
line before Ray (an unknown tracker with the list, a profiled step beyond max_steps, a profiled
role the run does not start, a missing tracker package at the run's checks)."""

from __future__ import annotations

import importlib.util

import pytest

from roll_device.commands.gate import check_before_start, load_config
from roll_device.errors import ConfigError


def test_the_defaults_log_to_the_console_and_profile_nothing():
    config = load_config([])
    assert config.logger == ["console"]
    assert (config.tracking.mode, config.tracking.mlflow_tracking_uri) == ("offline", None)
    assert config.profile.steps == [] and not config.profile.enabled


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["logger=[console,neptune]"],
            (
                "logger=['console', 'neptune']: unknown logger neptune: choose from console, tensorboard, "
                "wandb, mlflow, swanlab"
            ),
        ),
        (
            ["max_steps=3", "profile.steps=[2,5]"],
            "profile.steps=[2, 5]: step 5 is beyond max_steps=3: profile steps 1 to 3",
        ),
        (
            ["algorithm.kl_coef=0", "profile.steps=[1]", "profile.roles=[actor_train,reference]"],
            (
                "profile.roles=['actor_train', 'reference']: this run starts no reference role: profile some "
                "of actor_infer, actor_train, reward"
            ),
        ),
        (["profile.steps=[0]"], "profile.steps.0=0: input should be greater than or equal to 1"),
        (
            ["profile.activities=[]"],
            "profile.activities=[]: list should have at least 1 item after validation, not 0",
        ),
    ],
)
def test_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides)
    assert str(refused.value).split(" (")[0] == message


def test_a_profiled_role_that_runs_is_accepted():
    config = load_config(["max_steps=3", "profile.steps=[3]", "profile.roles=[reference,reward]"])
    assert config.profile.covers(3) and not config.profile.covers(2)


@pytest.mark.skipif(importlib.util.find_spec("swanlab") is not None, reason="swanlab is installed here")
def test_a_missing_tracker_package_is_refused_before_the_run_folder_is_made(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"pip install 'roll-device\[swanlab\]'"):
        check_before_start(load_config(["logger=[console,swanlab]"]), run_dir, None)
    assert not run_dir.exists()


def test_an_mlflow_server_where_nothing_answers_is_refused_before_the_run_folder_is_made(tmp_path):
    """MLflow itself retries such a server for about four minutes, then traces back."""
    run_dir = tmp_path / "run"
    uri = "tracking.mlflow_tracking_uri=http://127.0.0.1:9"
    with pytest.raises(ConfigError, match=r"=http://127.0.0.1:9: nothing answers at 127.0.0.1:9 \("):
        check_before_start(load_config(["logger=[mlflow]", uri]), run_dir, None)
    assert not run_dir.exists()
