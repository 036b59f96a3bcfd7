"""The HF rollout strategy on the CPU (the eager path of the decode graph runner): greedy output
equal to transformers' own generate, the model's logprobs, sampling, chunking, stops, weight
updates, offload, and config errors."""

import re

import pytest
import torch

import roll_device as rd
from roll_device.comm import weights_hash
from roll_device.errors import ConfigError
from roll_device.platforms.cpu import CpuPlatform
from strategies.base import SamplingConfig
from strategies.inference.hf import HfStrategy
from strategies.inference.hf_cache import SharedKVStore
from strategies.registry import registered, strategy_class
from tests.configs import rollout_settings
from tests.strategies.inference import serving_checks
from tests.strategies.inference.conftest import start, teacher_forced_logprobs

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
GREEDY = SamplingConfig(n=1, max_tokens=12, temperature=0.0)


def reference_greedy(model, prompt, max_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_registered_for_every_builtin_kind():
    table = registered()
    assert {k for (r, n, k) in table if (r, n) == ("inference", "hf")} == {"cpu", "cuda", "rocm", "npu"}
    assert strategy_class("inference", "hf", "npu") is HfStrategy


def test_greedy_equals_transformers_generate(hf_cpu, reference_model):
    out = hf_cpu.generate(PROMPTS, GREEDY)  # 3 rows: padded into the bucket of 4
    assert [(c.prompt_index, c.sample_index) for c in out] == [(0, 0), (1, 0), (2, 0)]
    for completion, prompt in zip(out, PROMPTS):
        assert completion.token_ids == reference_greedy(reference_model, prompt, 12)
        assert completion.finish_reason in ("length", "stop")


def test_logprobs_are_the_models_own(hf_cpu, reference_model):
    out = hf_cpu.generate(PROMPTS, SamplingConfig(n=2, max_tokens=10, temperature=1.0, seed=3))
    assert [(c.prompt_index, c.sample_index) for c in out] == [(i, s) for i in range(3) for s in range(2)]
    for c in out:
        assert len(c.logprobs) == len(c.token_ids) > 0
        expected = teacher_forced_logprobs(reference_model, PROMPTS[c.prompt_index], c.token_ids)
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_prefill_and_decode_run_without_cudnn_attention(hf_cpu):
    """Captured and eager decoding must use the same attention kernels: cuDNN's let their greedy
    tokens part on an H100 (docs/benchmarks.md), so the strategy leaves it out around every step."""
    seen = []
    hook = hf_cpu.model.register_forward_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        hf_cpu.generate([[5, 6, 7]], SamplingConfig(max_tokens=3, temperature=0.0))
    finally:
        hook.remove()
    assert seen == [False, False, False]  # the prefill and two decode steps
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after the call


def test_seeded_sampling_repeats_and_samples_differ(hf_cpu):
    sampling = SamplingConfig(n=3, max_tokens=8, temperature=1.0, seed=11)
    state = torch.get_rng_state()
    first, again = hf_cpu.generate([[5, 6]], sampling), hf_cpu.generate([[5, 6]], sampling)
    assert torch.equal(torch.get_rng_state(), state)  # a seeded call leaves the process's RNG alone
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert len({tuple(c.token_ids) for c in first}) == 3
    unseeded = SamplingConfig(n=3, max_tokens=8, temperature=1.0)
    assert [c.token_ids for c in hf_cpu.generate([[5, 6]], unseeded)] != [
        c.token_ids for c in hf_cpu.generate([[5, 6]], unseeded)
    ]


def test_batches_above_max_batch_size_run_in_chunks(hf_cpu):
    prompts = [[4 + i, 20 + i] for i in range(10)]  # max_batch_size is 8
    together = hf_cpu.generate(prompts, SamplingConfig(max_tokens=6, temperature=0.0))
    alone = [hf_cpu.generate([p], SamplingConfig(max_tokens=6, temperature=0.0))[0] for p in prompts]
    assert [c.prompt_index for c in together] == list(range(10))
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]


def test_stop_token_ends_a_response_and_is_kept(hf_cpu):
    tokens = hf_cpu.generate([PROMPTS[0]], GREEDY)[0].token_ids
    stop = tokens[2]
    out = hf_cpu.generate(
        [PROMPTS[0]], SamplingConfig(max_tokens=12, temperature=0.0, stop_token_ids=[stop])
    )[0]
    assert out.token_ids == tokens[: tokens.index(stop) + 1]
    assert out.finish_reason == "stop"


def test_processed_logprobs_follow_the_temperature(tiny_model_path, reference_model):
    strategy = start("hf", tiny_model_path, max_batch_size=2, logprobs_mode="processed_logprobs")
    try:
        c = strategy.generate([PROMPTS[1]], SamplingConfig(max_tokens=6, temperature=0.5, seed=0))[0]
    finally:
        strategy.shutdown()
    expected = teacher_forced_logprobs(reference_model, PROMPTS[1], c.token_ids, temperature=0.5)
    assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_weight_update_changes_output_and_restores_it(hf_cpu, checkpoint):
    before = hf_cpu.generate(PROMPTS, GREEDY)
    try:
        hf_cpu.update_weights((name, torch.zeros_like(t)) for name, t in checkpoint.items())
        zeroed = hf_cpu.generate(PROMPTS, GREEDY)
        assert [c.token_ids for c in zeroed] != [c.token_ids for c in before]
        assert all(not t.any() for t in hf_cpu.read_weights().values())
    finally:
        hf_cpu.update_weights(checkpoint.items())
    after = hf_cpu.generate(PROMPTS, GREEDY)
    assert [(c.token_ids, c.logprobs) for c in after] == [(c.token_ids, c.logprobs) for c in before]
    assert weights_hash(hf_cpu.read_weights().items()) == weights_hash(checkpoint.items())


def test_bad_weight_updates_are_refused(hf_cpu, checkpoint):
    with pytest.raises(ConfigError, match=r"no weight named \['model.layers.0.mlp.fc1.weight'\]"):
        hf_cpu.update_weights([("model.layers.0.mlp.fc1.weight", torch.zeros(2))])
    with pytest.raises(
        ConfigError, match=r"weight 'model.norm.weight' has shape \(3,\), the model expects \(128,\)"
    ):
        hf_cpu.update_weights([("model.norm.weight", torch.zeros(3))])
    assert weights_hash(hf_cpu.read_weights().items()) == weights_hash(checkpoint.items())


def test_offload_and_reload(tiny_model_path):
    strategy = start("hf", tiny_model_path, max_batch_size=4)
    try:
        before = strategy.generate(PROMPTS, GREEDY)
        weights = weights_hash(strategy.read_weights().items())
        strategy.offload()
        with pytest.raises(ConfigError, match="call reload"):
            strategy.generate(PROMPTS, GREEDY)
        strategy.reload()
        assert [c.token_ids for c in strategy.generate(PROMPTS, GREEDY)] == [c.token_ids for c in before]
        assert weights_hash(strategy.read_weights().items()) == weights
    finally:
        strategy.shutdown()
    with pytest.raises(ConfigError, match="generate before initialize"):
        strategy.generate(PROMPTS, GREEDY)


def test_sleep_level_two_drops_the_weights_and_takes_them_from_the_next_sync(tiny_model_path, checkpoint):
    strategy = start("hf", tiny_model_path, max_batch_size=4, sleep_level=2)
    try:
        strategy.model.lm_head.weight.data = strategy.model.lm_head.weight.data.clone()  # resizable storage
        before = strategy.generate(PROMPTS, GREEDY)
        strategy.offload()
        assert strategy.model.lm_head.weight.untyped_storage().nbytes() == 0 and strategy.turn.buffer is None
        strategy.reload()
        with pytest.raises(ConfigError, match=r"slept at rollout.sleep_level=2: \d+ weights were dropped"):
            strategy.generate(PROMPTS, GREEDY)
        strategy.update_weights(checkpoint.items())
        assert [c.token_ids for c in strategy.generate(PROMPTS, GREEDY)] == [c.token_ids for c in before]
    finally:
        strategy.shutdown()


def test_prompt_too_long_is_refused_before_work(hf_cpu):
    with pytest.raises(ConfigError, match="exceeds max_model_len=256"):
        hf_cpu.generate([[5] * 250], SamplingConfig(max_tokens=8))


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"capture_sizes": [1, 2, 128], "max_batch_size": 64},
            "rollout.capture_sizes has 128, larger than the largest batch 64",
        ),
        (
            {"capture_sizes": [1, 2], "max_batch_size": 64},
            "rollout.capture_sizes [1, 2] does not reach the largest batch 64",
        ),
        (
            {"dtype": "int8"},
            "rollout.dtype='int8': input should be 'auto', 'float32', 'bfloat16' or 'float16'",
        ),
        (
            {"logprobs_mode": "raw"},
            "rollout.logprobs_mode='raw': input should be 'raw_logprobs' or 'processed_logprobs'",
        ),
        ({"max_batch_size": 0}, "rollout.max_batch_size=0: input should be greater than or equal to 1"),
        ({"batch": 4}, "unknown key rollout.batch: the keys here are name, max_model_len,"),
    ],
)
def test_bad_settings_are_refused_when_the_section_is_read(changes, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        rollout_settings("hf", **changes)


class BudgetedPlatform(CpuPlatform):
    """STAND-IN for a platform with graphs and a budget of 3 (no graph is captured here)."""

    graph_budget = 3
    supports_graphs = True


def budgeted(**changes) -> HfStrategy:
    """An HF strategy on the budgeted platform with the shipped hf section and `changes` (not
    started: `_budgeted` reads only the settings and the platform)."""
    strategy = HfStrategy(BudgetedPlatform())
    strategy.settings = rollout_settings("hf", **changes)
    return strategy


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"max_batch_size": 64}, [1, 8, 64]),  # derived: thinned, the largest kept
        ({"max_batch_size": 64, "use_graphs": False}, [1, 2, 4, 8, 16, 32, 64]),  # no graphs
        ({"max_batch_size": 64, "capture_sizes": [4, 16, 64]}, [4, 16, 64]),  # listed: within budget
    ],
)
def test_capture_sizes_fit_the_graph_budget_by_the_shared_rule(changes, expected):
    assert budgeted(**changes)._budgeted() == expected


def test_listed_capture_sizes_over_the_graph_budget_are_refused():
    strategy = budgeted(max_batch_size=64, capture_sizes=[1, 2, 4, 64])
    with pytest.raises(ConfigError, match=r"over the device's budget of 3: list at most 3 sizes$"):
        strategy._budgeted()


def test_graphs_requested_on_the_cpu(tiny_model_path):
    with pytest.raises(ConfigError, match="use_graphs=true but platform 'cpu' has no device graphs"):
        start("hf", tiny_model_path, use_graphs=True)


def test_bucket_caches_are_views_of_one_store(reference_model):
    store = SharedKVStore(
        reference_model.config,
        max_rows=4,
        max_len=16,
        dtype=torch.float32,
        device=rd.get_platform("cpu").device(),
    )
    small, large = store.cache(2), store.cache(4)
    assert small.layers[0].keys.data_ptr() == large.layers[0].keys.data_ptr() == store.keys[0].data_ptr()
    keys = torch.ones(2, store.keys[0].shape[1], 1, store.keys[0].shape[3])
    small.update(keys, keys * 2, 0)
    assert torch.equal(store.keys[0][:2, :, 0], keys[:, :, 0]) and not store.keys[0][2:].any()
    assert int(small.layers[0].cumulative_length) == 1 and int(large.layers[0].cumulative_length) == 0


def test_on_the_simulated_npu_matches_the_cpu(tiny_model_path, hf_cpu):
    """SIMULATION: the NPU platform on the simulated NPU (ROLL_DEVICE=npu-sim), in its own process."""
    from tests.isolated import run_isolated

    sim = run_isolated("tests.strategies.inference.sim_checks:hf_on_simulated_npu", tiny_model_path)
    assert sim["platform"] == "npu (simulated)" and sim["weights_on"] == "npu:0"
    assert sim["uses_graphs"] is True  # simulated ACL graphs: captured decode steps, replayed
    assert sim["greedy"] == [c.token_ids for c in hf_cpu.generate(PROMPTS, GREEDY)]
    cpu_sampled = hf_cpu.generate(PROMPTS, SamplingConfig(n=2, max_tokens=8, temperature=1.0, seed=3))
    assert sim["sampled"] == [c.token_ids for c in cpu_sampled]


def test_requests_are_served_as_they_come(hf_cpu):
    serving_checks.served_as_they_come(hf_cpu)


def test_short_budgets_finish_first(hf_cpu):
    serving_checks.short_budgets_finish_first(hf_cpu)


def test_generate_is_the_request_path(hf_cpu):
    serving_checks.generate_is_the_request_path(hf_cpu)


def test_changes_wait_for_requests_in_flight(hf_cpu):
    serving_checks.changes_wait_for_requests_in_flight(hf_cpu)
