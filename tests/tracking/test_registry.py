"""The tracker registry: the keys every backend gets, names checked with the list, a second
registration under a taken name refused, and a tracker whose package is missing refused with its
extra (swanlab is not installed here: only its refusal is tested)."""

from __future__ import annotations

import importlib.util

import pytest

from roll_device.commands.gate import load_config
from roll_device.errors import ConfigError
from roll_device.tracking.registry import (
    TRACKERS,
    Tracker,
    check_names,
    check_trackers,
    register,
    scalars,
    tracker_names,
)


def test_the_same_metrics_for_every_backend_are_the_records_numbers_under_keys_all_take():
    record = {
        "step": 3,
        "loss": 0.5,
        "staleness": 0,
        "entropy": None,
        "sync_path": "bridge",
        "graph_guard": {"max_error": 0.1, "status": "ok"},
        "timeline": {"rollout": [1.0, 2.0]},
        "eval_pass@1": 1,
    }
    assert scalars(record) == {
        "loss": 0.5,
        "staleness": 0.0,
        "graph_guard/max_error": 0.1,
        "eval_pass_at_1": 1.0,
    }


def test_the_registered_trackers():
    assert tracker_names() == ["console", "tensorboard", "wandb", "mlflow", "swanlab"]


def test_unknown_or_repeated_logger_names_are_refused_with_the_list():
    with pytest.raises(ValueError, match="unknown logger neptune: choose from console, tensorboard, wandb"):
        check_names(["console", "neptune"])
    with pytest.raises(ValueError, match="name each logger once"):
        check_names(["console", "console"])


def test_a_second_tracker_under_a_taken_name_is_refused():
    class Other(Tracker):
        name = "console"

    with pytest.raises(ValueError, match="tracker 'console' is already registered by ConsoleTracker"):
        register(Other)
    assert TRACKERS["console"].__name__ == "ConsoleTracker"


@pytest.mark.skipif(importlib.util.find_spec("swanlab") is not None, reason="swanlab is installed here")
def test_a_tracker_without_its_package_is_refused_naming_its_extra():
    settings = load_config([]).tracking
    check_trackers(["console", "tensorboard", "wandb", "mlflow"], settings)
    with pytest.raises(ConfigError) as refused:
        check_trackers(["console", "swanlab"], settings)
    assert str(refused.value) == (
        "logger=swanlab: its package 'swanlab' is not installed: pip install 'roll-device[swanlab]', "
        "or leave swanlab out of logger"
    )
