"""The strategy registry: a name serves one class; registering it again with the same class is
harmless, with another class refused."""

import pytest

from strategies import registry
from strategies.base import INFERENCE
from strategies.registry import qualified_name, register_strategy

TOY = "tests.strategies.toy_engine:ToyEngine"


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    monkeypatch.setattr(registry, "STRATEGIES", dict(registry.STRATEGIES))


def test_the_same_registration_twice_is_kept():
    register_strategy(INFERENCE, "toy", TOY)
    register_strategy(INFERENCE, "toy", TOY)
    assert qualified_name(INFERENCE, "toy") == TOY


def test_a_different_class_under_a_taken_name_is_refused():
    with pytest.raises(
        ValueError, match=r"inference strategy 'vllm' is already registered as .*VllmStrategy"
    ):
        register_strategy(INFERENCE, "vllm", TOY)
    assert qualified_name(INFERENCE, "vllm") == "strategies.inference.vllm:VllmStrategy"
