"""Shared fixtures: a fresh platform registry per test, and the tiny model made once per session.

Every Ray cluster a test starts is a throwaway one on this machine, so the whole session runs
without Ray's token authentication: Ray fixes a process's mode at its first local `ray.init`
(token, when RAY_AUTH_MODE is unset), and a simulated cluster (token-less) driven later from the
same process would then lose its actors. docs/cluster.md says the same for users.
"""

from __future__ import annotations

import os

import pytest

from roll_device.cluster.sim_nodes import AUTH_MODE_ENV
from roll_device.platforms import registry

os.environ[AUTH_MODE_ENV] = "disabled"


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv("ROLL_DEVICE", raising=False)
    registry.reset_for_tests()
    yield
    registry.reset_for_tests()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from roll_device.models.tiny import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2"))
