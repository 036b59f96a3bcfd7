"""Shared fixtures: a fresh platform registry per test, the tiny model made once per session (a
session-wide ROLL_DEVICE_HOME, so runs share the one the default `model.tiny_dir` names), and one
Ray cluster for the session's whole runs (`shared_cluster`); under pytest-xdist, tests marked
`alone` run with no other test beside them (tests/run_alone.py).

Every Ray cluster a test starts is a throwaway one on this machine, so the whole session runs
without Ray's token authentication: Ray fixes a process's mode at its first local `ray.init`
(token, when RAY_AUTH_MODE is unset), and a simulated cluster (token-less) driven later from the
same process would then lose its actors. docs/cluster.md says the same for users.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from roll_device.cluster.sim_nodes import AUTH_MODE_ENV
from roll_device.platforms import registry
from tests.isolated import ROOT, isolated_env
from tests.run_alone import held_slot, shared_dir

os.environ[AUTH_MODE_ENV] = "disabled"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with held_slot(item.get_closest_marker("alone") is not None, shared_dir(item.config)):
        yield


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """ROLL_DEVICE_HOME for the session: what runs make on first use (the tiny model) is made once,
    and nothing is written into the user's ~/.cache."""
    home = tmp_path_factory.mktemp("roll-device-home")
    before = os.environ.get("ROLL_DEVICE_HOME")
    os.environ["ROLL_DEVICE_HOME"] = str(home)
    yield home
    if before is None:
        del os.environ["ROLL_DEVICE_HOME"]
    else:
        os.environ["ROLL_DEVICE_HOME"] = before


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv("ROLL_DEVICE", raising=False)
    registry.reset_for_tests()
    yield
    registry.reset_for_tests()


@pytest.fixture(scope="session")
def tiny_model_path(session_home):
    """The tiny model at the default `model.tiny_dir` of the session: the one runs use, made once."""
    from roll_device.models.tiny import make_tiny_model

    return str(make_tiny_model(session_home / "tiny-qwen2"))


@pytest.fixture(scope="session")
def shared_cluster():
    """The overrides that run a whole run on the session's one local Ray cluster
    (tests/ray_head.py), joined as an existing cluster (`cluster=remote`): each run is a Ray job
    of its own, and no run pays for Ray's start. Runs that test the embedded cluster itself, or
    need a cluster of other resources, start their own."""
    head = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_head"],
        cwd=ROOT,
        env=isolated_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    address = head.stdout.readline().strip()
    if not address:
        head.wait(timeout=60)
        pytest.fail(f"the session's Ray cluster did not start (exit {head.returncode}); its output is above")
    yield ("cluster=remote", f"cluster.address={address}")
    head.stdin.close()
    head.wait(timeout=120)
