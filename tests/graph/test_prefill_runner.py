"""The prefill graph runner: its eager path on this machine's CPU (buckets, padding, slicing,
refusals), dynamo splitting a compiled forward at the boundaries, and piecewise capture and
replay on the SIMULATED NPU (in a process of its own; results there are simulations)."""

import pytest
import torch

import roll_device as rd
from roll_device.errors import ConfigError
from roll_device.graph.prefill import compiled
from tests.graph.prefill_toy import WIDTH, ToyPrefill, padded
from tests.isolated import run_isolated


@pytest.fixture
def cpu_toy():
    toy = ToyPrefill(torch.device("cpu"))
    toy.build(rd.get_platform("cpu"), [4, 8], use_graphs=False)
    return toy


def test_cpu_runs_eager_through_buckets_padding_and_slicing(cpu_toy):
    runner = cpu_toy.runner
    assert [runner.bucket(n) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]
    assert runner.bucket(9) is None  # over the largest bucket: the caller prefills eagerly
    x, last = torch.randn(6, WIDTH), torch.tensor([2, 5])
    got = runner.run(8, padded(8, x, last), rows=2)
    assert got.shape == (2, WIDTH) and torch.allclose(got, cpu_toy.reference(x, last), atol=1e-6)
    assert cpu_toy.attention_calls == 2 and runner.capture_order == [] and runner.graph_count == 0


def test_inputs_not_padded_to_the_bucket_are_refused(cpu_toy):
    with pytest.raises(
        ValueError, match=r"input 'x' has shape \(6, 4\), bucket 8 holds \(8, 4\): pad the batch"
    ):
        cpu_toy.runner.run(8, {"x": torch.zeros(6, WIDTH), "last": torch.zeros(3, dtype=torch.long)}, 1)
    with pytest.raises(ValueError, match="do not match the forward's inputs"):
        cpu_toy.runner.run(8, {"x": torch.zeros(8, WIDTH)}, 1)
    with pytest.raises(ValueError, match="at least one token"):
        cpu_toy.runner.bucket(0)


def test_graphs_asked_for_where_the_platform_has_none():
    with pytest.raises(
        ConfigError,
        match="prefill graphs asked for, but platform 'cpu' has no device graphs here: "
        "set rollout.prefill_graphs to false",
    ):
        ToyPrefill(torch.device("cpu")).build(rd.get_platform("cpu"), [4])


def test_compile_backend_by_kind():
    backends = {kind: rd.get_platform(kind).compile_backend for kind in ("cuda", "rocm", "npu", "cpu")}
    assert backends == {"cuda": "inductor", "rocm": "inductor", "npu": "eager", "cpu": "inductor"}


def test_the_eager_backend_leaves_the_forward_as_written():
    def forward(size, inputs):
        return inputs

    assert compiled(forward, "eager") is forward and compiled(forward, None) is forward


def test_a_compiled_forward_is_split_at_every_boundary():
    """Dynamo does not trace into `boundary`: the forward becomes graphs around the attentions,
    which run eagerly, and the result equals the uncompiled forward's."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append([node.target for node in graph_module.graph.nodes])
        return graph_module.forward

    toy = ToyPrefill(torch.device("cpu"))
    toy.build(rd.get_platform("cpu"), [8], use_graphs=False, compile_backend=counting_backend)
    x, last = torch.randn(5, WIDTH), torch.tensor([0, 4])
    got = toy.runner.run(8, padded(8, x, last), rows=2)
    assert torch.allclose(got, toy.reference(x, last), atol=1e-6)
    assert len(graphs) >= 3  # before, between and after the two attentions
    assert all(torch.cumsum not in targets for targets in graphs)  # attention never compiled
    assert toy.attention_calls == 2


@pytest.fixture(scope="module")
def sim():
    return run_isolated("tests.graph.prefill_checks:piecewise_capture", timeout=120)


def test_pieces_split_at_attention_replay_equal_to_eager_on_the_simulated_npu(sim):
    """tests/graph/test_graphs_on_device.py's piecewise test (three pieces per bucket, largest
    first, replay with eager attention equal to the forward) passes on the simulated NPU."""
    assert sim["platform"] == "npu (simulated)" and sim["compile_backend"] == "eager"
    assert sim["replay_equals_eager"]


def test_a_host_read_in_a_piece_fails_at_capture_and_releases_the_graphs(sim):
    error = sim["host_read"]
    assert error.startswith("RuntimeError: NPU function error") and "error code is 107027" in error
    assert sim["host_read_released"] == [False, 0, []]
