"""The decode graph runner on this machine's CPU (no graphs: the eager path through the same
bucket, pad and slice code), and its capture glue checked against a labelled stand-in graph API."""

import contextlib

import pytest
import torch

import roll_device as rd
from roll_device.errors import ConfigError
from roll_device.graph import DecodeGraphRunner
from roll_device.graph.captures import WARMUP_RUNS
from roll_device.platforms.cpu import CpuPlatform

WIDTH = 3


class Step:
    """A decode-like step: output row r = 2 * x[r] + bias[r]; records which bucket ran."""

    def __init__(self):
        self.calls = []

    def make_inputs(self, size):
        return {"x": torch.zeros(size, WIDTH), "bias": torch.full((size, 1), -1.0)}

    def __call__(self, size, inputs):
        self.calls.append(size)
        return inputs["x"] * 2 + inputs["bias"]


def test_cpu_runs_eager_through_buckets_padding_and_slicing():
    cpu = rd.get_platform("cpu")
    step = Step()
    runner = DecodeGraphRunner(cpu, [1, 2, 4, 8], step.make_inputs, step)
    assert runner.use_graphs is False
    x = torch.arange(3 * WIDTH, dtype=torch.float32).reshape(3, WIDTH)
    out = runner.run({"x": x, "bias": torch.ones(3, 1)})
    assert out.shape == (3, WIDTH) and torch.equal(out, x * 2 + 1)
    assert step.calls == [4]  # 3 rows padded into the bucket of 4
    static = runner.static_inputs(4)
    assert torch.equal(static["x"][:3], x) and torch.equal(static["x"][3], torch.zeros(WIDTH))
    assert torch.equal(static["bias"][3], torch.tensor([-1.0]))  # padding rows keep their fill
    pointer = static["x"].data_ptr()
    runner.run({"x": torch.ones(5, WIDTH), "bias": torch.zeros(5, 1)})
    runner.run({"x": torch.ones(2, WIDTH), "bias": torch.zeros(2, 1)})
    assert step.calls == [4, 8, 2]
    assert runner.static_inputs(4)["x"].data_ptr() == pointer  # static buffers are reused
    assert runner.capture_order == []


def test_bad_batches_are_refused():
    step = Step()
    runner = DecodeGraphRunner(rd.get_platform("cpu"), [1, 2], step.make_inputs, step)
    with pytest.raises(ValueError, match="same number of rows"):
        runner.run({"x": torch.ones(2, WIDTH), "bias": torch.ones(1, 1)})
    with pytest.raises(ValueError, match="do not match the step's inputs"):
        runner.run({"x": torch.ones(2, WIDTH)})
    with pytest.raises(ValueError, match="exceeds the largest captured size 2"):
        runner.run({"x": torch.ones(3, WIDTH), "bias": torch.ones(3, 1)})


def test_graphs_requested_where_the_platform_has_none():
    step = Step()
    with pytest.raises(ConfigError, match="use_graphs=true but platform 'cpu' has no device graphs"):
        DecodeGraphRunner(rd.get_platform("cpu"), [1], step.make_inputs, step, use_graphs=True)


def test_release_starts_over():
    step = Step()
    runner = DecodeGraphRunner(rd.get_platform("cpu"), [1, 2], step.make_inputs, step)
    runner.prepare()
    assert runner.prepared
    runner.release()
    assert not runner.prepared
    assert torch.equal(
        runner.run({"x": torch.ones(1, WIDTH), "bias": torch.zeros(1, 1)}), 2 * torch.ones(1, WIDTH)
    )


class StandInGraph:
    """STAND-IN for a device graph (this machine has none): records capture and replay. It does
    not capture work; it lets the runner's glue (order, pool, warm-up, replay, slicing) be tested."""

    def __init__(self, log):
        self.log, self.replays = log, 0

    def replay(self):
        self.replays += 1


class StandInGraphPlatform(CpuPlatform):
    """STAND-IN platform that offers the graph members over the CPU, recording every call."""

    graph_class_name = "StandInGraph"

    def __init__(self):
        super().__init__()
        self.log = []

    @property
    def supports_graphs(self):
        return True

    def graph_class(self):
        return lambda: StandInGraph(self.log)

    def new_stream(self):
        self.log.append("new-stream")
        return super().new_stream()

    def graph_pool_handle(self):
        self.log.append("pool")
        return ("pool", len(self.log))

    @contextlib.contextmanager
    def graph_capture(self, graph, pool=None, stream=None):
        self.log.append(("capture-begin", pool))
        yield
        self.log.append("capture-end")

    def weak_ref_tensor(self, tensor):
        self.log.append(("weak-ref", tuple(tensor.shape)))
        return tensor


def test_capture_glue_with_a_stand_in_graph_api():
    platform = StandInGraphPlatform()
    step = Step()
    runner = DecodeGraphRunner(platform, [1, 2, 4], step.make_inputs, step)
    assert runner.use_graphs
    runner.prepare()
    assert runner.capture_order == [4, 2, 1]  # largest first
    assert platform.log.count("pool") == 1  # one pool, shared by every graph
    assert platform.log.count("new-stream") == 1  # one warm-up stream: its cached blocks are reused
    pools = [entry[1] for entry in platform.log if isinstance(entry, tuple) and entry[0] == "capture-begin"]
    assert len(pools) == 3 and len(set(pools)) == 1
    assert [e for e in platform.log if isinstance(e, tuple) and e[0] == "weak-ref"] == [
        ("weak-ref", (4, WIDTH)),
        ("weak-ref", (2, WIDTH)),
        ("weak-ref", (1, WIDTH)),
    ]
    # each size: warm-up runs, then the captured run
    assert step.calls == [4] * (WARMUP_RUNS + 1) + [2] * (WARMUP_RUNS + 1) + [1] * (WARMUP_RUNS + 1)
    step.calls.clear()
    out = runner.run({"x": torch.ones(3, WIDTH), "bias": torch.zeros(3, 1)})
    assert step.calls == []  # replayed, not run
    assert runner._graphs[4].replays == 1 and runner._graphs[2].replays == 0
    assert out.shape == (3, WIDTH)  # the static output of bucket 4, sliced to the batch


class FailingCaptureStep(Step):
    """A step whose capture of bucket 2 fails (as a host read or a missing stream would)."""

    def __call__(self, size, inputs):
        if size == 2 and self.calls.count(2) == WARMUP_RUNS:
            raise RuntimeError("capture failed")
        return super().__call__(size, inputs)


def test_a_failed_capture_releases_what_was_captured():
    platform = StandInGraphPlatform()
    step = FailingCaptureStep()
    runner = DecodeGraphRunner(platform, [1, 2, 4], step.make_inputs, step)
    with pytest.raises(RuntimeError, match="capture failed") as failure:
        runner.prepare()
    assert "while capturing the decode step of batch size 2" in str(failure.value.__notes__)
    assert "captured before it: [4]" in str(failure.value.__notes__)
    assert not runner.prepared and runner._graphs == {} and runner.capture_order == []
