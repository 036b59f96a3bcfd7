"""The simulated NPU's settings (`ROLL_SIM_*`): a value a variable does not take is refused in one
line that names the variable and the values it takes, in Python and at the CLI (exit 2, no traceback).

The settings module imports nothing heavy and installs nothing: its checks run in this process; the
CLI and `install()` run in processes of their own.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll_device.errors import ConfigError
from roll_device.sim import settings

ROOT = Path(__file__).resolve().parents[2]
COUNT_TAKES = "give the number of simulated NPUs, a whole number of 1 or more (default 8)"


@pytest.mark.parametrize(
    "value, why",
    [
        ("abc", "is not a whole number"),
        ("0", "is below 1"),
        ("-2", "is below 1"),
        ("", "is not a whole number"),
    ],
)
def test_a_device_count_it_does_not_take_is_refused(monkeypatch, value, why):
    monkeypatch.setenv("ROLL_SIM_NPU_COUNT", value)
    with pytest.raises(ConfigError) as refused:
        settings.check_all()
    assert str(refused.value) == f"ROLL_SIM_NPU_COUNT={value!r} {why}: {COUNT_TAKES}"


@pytest.mark.parametrize("value", ["0", "-1", "16GiB", "1.5"])
def test_a_memory_size_it_does_not_take_is_refused(monkeypatch, value):
    monkeypatch.setenv("ROLL_SIM_NPU_MEMORY_BYTES", value)
    with pytest.raises(ConfigError, match=r"^ROLL_SIM_NPU_MEMORY_BYTES=.* a whole number of 1 or more"):
        settings.check_all()


def test_defaults_and_good_values(monkeypatch):
    for setting in settings.ALL:
        monkeypatch.delenv(setting.env, raising=False)
    assert [s.value() for s in settings.ALL] == [8, 64 << 30, 2048, "Ascend910B2"]
    monkeypatch.setenv("ROLL_SIM_NPU_COUNT", " 1 ")
    monkeypatch.setenv("ROLL_SIM_NPU_NAME", "Ascend910B3")
    assert settings.COUNT.value() == 1 and settings.NAME.value() == "Ascend910B3"
    monkeypatch.setenv("ROLL_SIM_NPU_NAME", " ")
    with pytest.raises(ConfigError, match=r"^ROLL_SIM_NPU_NAME=' ' is blank: give the device name"):
        settings.check_all()


def _python(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "ROLL_DEVICE": "npu-sim", **env}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_the_cli_refuses_a_bad_count_in_one_line(value, tmp_path):
    proc = _python("-m", "roll_device.cli", "plan", ROLL_SIM_NPU_COUNT=value, ROLL_DEVICE_HOME=str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"roll-device plan: error: ROLL_SIM_NPU_COUNT='{value}' ")
    )


def test_installing_the_simulation_refuses_a_bad_count_before_anything():
    # Before: `abc` ended in a ValueError traceback from int(); `0` installed a device with no NPUs
    # on which `npu:0` tensors still allocated.
    code = "import roll_device as rd\ntry:\n    rd.current_platform()\nexcept Exception as e:\n    print(type(e).__name__, e)"
    proc = _python("-c", code, ROLL_SIM_NPU_COUNT="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"ConfigError ROLL_SIM_NPU_COUNT='0' is below 1: {COUNT_TAKES}"
