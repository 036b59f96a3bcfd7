"""Shared fixtures: a fresh platform registry per test, and the tiny model made once per session."""

from __future__ import annotations

import pytest

from roll_device.platforms import registry


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
