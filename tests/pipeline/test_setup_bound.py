"""Every wait of the workers' set-up is bounded (`cluster.setup_timeout_s`): a rollout engine
stuck in its set-up ends the run within the bound plus seconds, in one line naming its role (and
any other still setting up on a loaded machine) and the setting, with no step run."""

import shutil
import time

import pytest

from roll_device.commands.compose import config_dir
from roll_device.commands.run import run_checked
from roll_device.pipeline.roles import SetupTimeoutError
from strategies.base import INFERENCE
from strategies.registry import register_strategy
from tests.configs import run_config
from tests.strategies.test_toy_engine import TOY_YAML

BOUND_S = 5  # any bound holds: the stuck set-up never ends, so it need not be long


@pytest.fixture
def stuck(tmp_path, monkeypatch):
    """The shipped configs with `rollout/stuck.yaml`, and the stuck engine registered."""
    configs = tmp_path / "configs"
    shutil.copytree(config_dir(), configs)
    (configs / "rollout" / "stuck.yaml").write_text(TOY_YAML.replace("name: toy", "name: stuck"))
    monkeypatch.setenv("ROLL_DEVICE_CONFIG_DIR", str(configs))
    monkeypatch.setattr(
        "strategies.registry.STRATEGIES", dict(__import__("strategies.registry").registry.STRATEGIES)
    )
    register_strategy(INFERENCE, "stuck", "tests.pipeline.stuck_engine:StuckEngine")
    return tmp_path


def test_a_set_up_that_never_ends_ends_the_run_within_its_bound(stuck, shared_cluster):
    config = run_config(*shared_cluster, "rollout=stuck", f"cluster.setup_timeout_s={BOUND_S}")
    started = time.monotonic()
    with pytest.raises(SetupTimeoutError) as ended:
        run_checked(config, stuck / "run")
    took = time.monotonic() - started
    message = str(ended.value)
    assert "\n" not in message and ended.value.exit_code == 1
    stuck = message.split(" did not finish set-up within ")[0]  # roles still setting up then
    assert "'actor_infer'" in stuck, message
    assert f" did not finish set-up within {BOUND_S}s (cluster.setup_timeout_s)" in message
    assert "no step ran" in message
    assert took < BOUND_S + 180, f"ended {took:.0f}s after the start"  # start-up on a loaded machine
