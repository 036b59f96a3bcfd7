"""Real device graphs (CUDA, ROCm, or NPU graphs): capture, shared pool, replay equal to eager, and
a prefill captured in pieces split at attention. Skipped cleanly where this process's platform has
no graphs (this project's CPU CI)."""

import pytest
import torch

import roll_device as rd
from roll_device.graph import DecodeGraphRunner
from tests.graph.prefill_toy import WIDTH, ToyPrefill, padded

pytestmark = pytest.mark.gpu


@pytest.fixture
def platform():
    p = rd.current_platform()
    if not p.supports_graphs:
        pytest.skip(f"platform '{p.name}' has no device graphs here")
    return p


def test_replay_equals_eager_for_every_batch(platform):
    device = platform.device()
    torch.manual_seed(0)
    weight = torch.randn(64, 64, device=device)

    def make_inputs(size):
        return {"x": torch.zeros(size, 64, device=device)}

    def step(size, inputs):
        return torch.tanh(inputs["x"] @ weight).softmax(dim=-1)

    graphs = DecodeGraphRunner(platform, [1, 2, 4, 8], make_inputs, step, use_graphs=True)
    eager = DecodeGraphRunner(platform, [1, 2, 4, 8], make_inputs, step, use_graphs=False)
    graphs.prepare()
    assert graphs.capture_order == [8, 4, 2, 1]
    for rows in range(1, 9):
        x = torch.randn(rows, 64, device=device)
        got = graphs.run({"x": x}).clone()
        platform.synchronize()
        assert torch.allclose(got, eager.run({"x": x}), atol=1e-6), rows


def test_buckets_share_one_memory_pool(platform):
    """Graphs captured largest first in one pool reuse the largest one's blocks: capturing every
    bucket reserves little more than capturing the largest alone (separate pools would add about
    another largest bucket's worth)."""
    device = platform.device()
    hidden = 1 << 16  # 16 rows x 65536 fp32 = 4 MiB per intermediate at the largest bucket
    weight = torch.randn(64, hidden, device=device) / 8

    def make_inputs(size):
        return {"x": torch.zeros(size, 64, device=device)}

    def step(size, inputs):
        return ((inputs["x"] @ weight).relu() * 2).softmax(dim=-1)

    def reserved_by_capture(sizes):
        platform.synchronize()
        platform.empty_cache()
        start = platform.memory.memory_reserved()
        runner = DecodeGraphRunner(platform, sizes, make_inputs, step, use_graphs=True)
        runner.prepare()
        platform.synchronize()
        grown = platform.memory.memory_reserved() - start
        runner.release()
        return grown

    largest_alone = reserved_by_capture([16])
    every_bucket = reserved_by_capture([1, 2, 4, 8, 16])
    assert largest_alone > 0
    assert every_bucket < 1.5 * largest_alone, (every_bucket, largest_alone)


def test_piecewise_prefill_replay_equals_eager(platform):
    """A prefill-like forward captured per token-count bucket in pieces split at its two eager
    "attentions": three graphs per bucket, replay (attention run between the pieces) equal to the
    forward computed directly, for batches padded into each bucket."""
    device = platform.device()
    toy = ToyPrefill(device)
    runner = toy.build(platform, [4, 8, 16])
    runner.prepare()
    assert runner.capture_order == [16, 8, 4]
    assert [runner.pieces(size) for size in (4, 8, 16)] == [3, 3, 3] and runner.graph_count == 9
    for tokens, last in ((3, [2]), (8, [1, 7]), (11, [0, 5, 10]), (16, [15])):
        x = torch.randn(tokens, WIDTH, device=device)
        index = torch.tensor(last, device=device)
        size = runner.bucket(tokens)
        calls = toy.attention_calls
        got = runner.run(size, padded(size, x, index), len(last)).clone()
        platform.synchronize()
        assert torch.allclose(got, toy.reference(x, index), atol=1e-6), tokens
        assert toy.attention_calls - calls == 2  # the attentions ran eagerly between the pieces
    assert runner.bucket(17) is None
    runner.release()
    assert runner.graph_count == 0
