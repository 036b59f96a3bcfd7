"""The advantage estimators against their papers' formulas, written out here element by element
(plain Python over the rewards), on random data; their edge cases; the registry."""

from __future__ import annotations

import statistics

import pytest
import torch

from roll_device.errors import ConfigError
from strategies.training.advantages import (
    ADVANTAGES,
    AdvantageInputs,
    AdvantageSpec,
    advantages,
    gae_advantages,
    gae_returns,
    informative_groups,
    overlong_penalty,
)

G = 4


def random_step(groups: int = 3, width: int = 5, seed: int = 0):
    """Scores (N,), a response mask with rows of different lengths (one empty), and logprobs."""
    gen = torch.Generator().manual_seed(seed)
    n = groups * G
    scores = torch.rand(n, generator=gen)
    lengths = torch.randint(1, width + 1, (n,), generator=gen)
    lengths[1] = 0  # an empty response
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    old = -torch.rand(n, width, generator=gen)
    ref = -torch.rand(n, width, generator=gen)
    return scores, mask, old, ref


def estimate(name: str, scores, mask=None, old=None, ref=None, **options) -> torch.Tensor:
    return advantages(AdvantageInputs(scores, G, mask, old, ref), AdvantageSpec(name, **options))


@pytest.mark.parametrize("unbiased", [True, False])
def test_grpo_is_the_reward_less_the_group_mean_over_the_group_std(unbiased):
    # DeepSeekMath (arXiv 2402.03300), 4.1.2: A_i = (r_i - mean(r)) / std(r)
    scores, *_ = random_step()
    std = statistics.stdev if unbiased else statistics.pstdev
    expected = []
    for g in range(len(scores) // G):
        group = scores[g * G : (g + 1) * G].tolist()
        expected += [(r - statistics.mean(group)) / (std(group) + 1e-6) for r in group]
    got = estimate("grpo", scores, std_unbiased=unbiased)
    assert got.tolist() == pytest.approx(expected, rel=1e-5)


def test_the_default_std_is_the_unbiased_one_of_verl_and_trl():
    scores, *_ = random_step()
    biased, unbiased = estimate("grpo", scores, std_unbiased=False), estimate("grpo", scores)
    assert (biased / unbiased).tolist() == pytest.approx([(G / (G - 1)) ** 0.5] * len(scores), rel=1e-4)


def test_dr_grpo_leaves_the_reward_less_the_group_mean():
    # Dr. GRPO (arXiv 2503.20783), eq. 3: A_i = r_i - mean(r), no std
    scores, *_ = random_step()
    expected = [
        r - statistics.mean(scores[i // G * G : i // G * G + G].tolist())
        for i, r in enumerate(scores.tolist())
    ]
    assert estimate("grpo", scores, norm_std=False).tolist() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_a_group_of_identical_rewards_has_zero_advantages(name):
    got = estimate(name, torch.tensor([0.5] * G + [1.0, 0.0, 1.0, 0.0]))
    assert got[:G].tolist() == [0.0] * G
    assert torch.isfinite(got).all()


def test_rloo_is_the_reward_less_the_mean_of_the_others():
    # RLOO (arXiv 2402.14740), eq. 7: A_i = r_i - 1/(k-1) sum_{j != i} r_j
    scores, *_ = random_step()
    expected = []
    for i, r in enumerate(scores.tolist()):
        start = i // G * G
        others = [scores[j].item() for j in range(start, start + G) if j != i]
        expected.append(r - sum(others) / (G - 1))
    assert estimate("rloo", scores).tolist() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_rloo_with_one_sample_per_prompt_is_refused():
    inputs = AdvantageInputs(torch.rand(3), 1)
    with pytest.raises(ConfigError, match="rloo needs algorithm.samples_per_prompt >= 2"):
        advantages(inputs, AdvantageSpec("rloo"))


def normalised(values: list[float]) -> list[float]:
    mean, std = statistics.mean(values), statistics.stdev(values)
    return [(v - mean) / std for v in values]


def test_reinforce_pp_returns_with_the_kl_in_the_reward_normalised_over_the_batch():
    # REINFORCE++ (arXiv 2501.03262), eqs. 2-3 and 4.1: r_t = 1[t = T] r(x, y) - beta KL_t with
    # KL_t = log pi_old / pi_ref, the return sum_{i >= t} r_i, normalised over every token of the batch
    scores, mask, old, ref = random_step()
    beta = 0.05
    returns = []  # (row, t, return) of every response token
    for b in range(len(scores)):
        length = int(mask[b].sum())
        rewards = [
            -beta * (old[b, t] - ref[b, t]).item() + (scores[b].item() if t == length - 1 else 0.0)
            for t in range(length)
        ]
        returns += [(b, t, sum(rewards[t:])) for t in range(length)]
    expected = torch.zeros_like(mask)
    for (b, t, _), value in zip(returns, normalised([r for *_, r in returns])):
        expected[b, t] = value
    got = estimate("reinforce_pp", scores, mask, old, ref, kl_coef=beta, kl_in_reward=True)
    assert torch.allclose(got, expected, atol=1e-4)
    assert got[1].abs().sum() == 0  # the empty response has no advantage


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_normalises_over_the_batch():
    # REINFORCE++-baseline (arXiv 2501.03262 v4, 3.2): A = r - mean_group(r), normalised over the batch's tokens
    scores, mask, *_ = random_step()
    tokens = []
    for b, r in enumerate(scores.tolist()):
        group = scores[b // G * G : b // G * G + G].tolist()
        tokens += [(b, t, r - statistics.mean(group)) for t in range(int(mask[b].sum()))]
    expected = torch.zeros_like(mask)
    for (b, t, _), value in zip(tokens, normalised([a for *_, a in tokens])):
        expected[b, t] = value
    assert torch.allclose(estimate("reinforce_pp_baseline", scores, mask), expected, atol=1e-4)


def test_the_kl_in_the_reward_lowers_a_sequence_estimator_s_scores_by_the_row_s_kl():
    scores, mask, old, ref = random_step()
    beta = 0.1
    penalised = scores - beta * ((old - ref) * mask).sum(dim=1)
    with_kl = estimate("rloo", scores, mask, old, ref, kl_coef=beta, kl_in_reward=True)
    assert torch.allclose(with_kl, estimate("rloo", penalised), atol=1e-6)


def test_rewards_that_do_not_split_into_groups_are_refused():
    with pytest.raises(ConfigError, match="do not split into groups of 4"):
        estimate("grpo", torch.rand(6))


def test_dapo_s_overlong_penalty_falls_linearly_over_the_buffer():
    # DAPO (arXiv 2503.14476), eq. 13: 0 up to L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache up to L_max
    lengths, l_max, l_cache = [2, 12, 13, 16, 20], 20, 8
    expected = [0.0 if y <= l_max - l_cache else ((l_max - l_cache) - y) / l_cache for y in lengths]
    assert overlong_penalty(torch.tensor(lengths), l_max, l_cache, 1.0).tolist() == pytest.approx(expected)
    assert overlong_penalty(torch.tensor(lengths), l_max, 0, 1.0).tolist() == [0.0] * 5


def test_informative_groups_are_those_whose_rewards_differ():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert informative_groups(scores, 2).tolist() == [False, True, False]


def constant(inputs: AdvantageInputs, settings: AdvantageSpec) -> torch.Tensor:
    """A plugin's estimator: every advantage 1."""
    return torch.ones(inputs.scores.shape)


def test_a_plugin_estimator_is_one_registration_and_a_second_one_under_its_name_is_refused():
    qualified = f"{__name__}:constant"
    ADVANTAGES.register("constant_test", qualified)
    ADVANTAGES.register("constant_test", qualified)  # the same again: a no-op
    try:
        assert estimate("constant_test", torch.rand(G)).tolist() == [1.0] * G
        assert estimate(qualified, torch.rand(G)).tolist() == [1.0] * G  # or by its qualified name
        with pytest.raises(ValueError, match="'constant_test' is already registered as"):
            ADVANTAGES.register("constant_test", "elsewhere:constant")
    finally:
        del ADVANTAGES.entries["constant_test"]


def test_an_unknown_estimator_lists_the_known_ones():
    with pytest.raises(
        ConfigError,
        match="algorithm.advantage=vtrace: unknown advantage estimator, choose one of gae, grpo, reinforce_pp, "
        "reinforce_pp_baseline, rloo",
    ):
        estimate("vtrace", torch.rand(G))


# ---- gae (Schulman et al., arXiv 1506.02438) ------------------------------------------------------
PROMPT = 2  # positions of prompt before each response: the estimator must carry across them


def ppo_step(seed: int = 0, width: int = 8):
    """Scores, a mask whose responses start after PROMPT positions and end at different places
    (one early, one empty), logprobs and values (N, T) of the response tokens."""
    gen = torch.Generator().manual_seed(seed)
    n = 2 * G
    lengths = torch.tensor([width - PROMPT, 1, 3, 0, width - PROMPT, 2, 4, 5])
    positions = torch.arange(width)[None, :]
    mask = ((positions >= PROMPT) & (positions < PROMPT + lengths[:, None])).float()
    values = torch.randn(n, width, generator=gen) * mask
    old, ref = -torch.rand(n, width, generator=gen), -torch.rand(n, width, generator=gen)
    return torch.rand(n, generator=gen), mask, old, ref, values


def gae_by_the_paper(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t, V after the last 0."""
    length = len(rewards)
    following = [*values[1:], 0.0]
    deltas = [rewards[t] + gamma * following[t] - values[t] for t in range(length)]
    return [sum((gamma * lam) ** k * deltas[t + k] for k in range(length - t)) for t in range(length)]


def paper_advantages(scores, mask, old, ref, values, gamma, lam, kl_coef):
    """Per row, over its response tokens: rewards -kl_coef (old - ref), the score added on the
    last; the paper's GAE. Returns {(row, position): A}."""
    found = {}
    for row in range(len(scores)):
        where = [t for t in range(mask.shape[1]) if mask[row, t] > 0]
        rewards = [-kl_coef * float(old[row, t] - ref[row, t]) for t in where]
        if where:
            rewards[-1] += float(scores[row])
        row_values = [float(values[row, t]) for t in where]
        found.update(zip([(row, t) for t in where], gae_by_the_paper(rewards, row_values, gamma, lam)))
    return found


def gae_inputs(scores, mask, old, ref, values):
    return AdvantageInputs(scores, G, mask, old, ref, values)


def test_gae_is_the_papers_discounted_sum_of_td_errors_whitened_over_the_batch():
    scores, mask, old, ref, values = ppo_step()
    spec = AdvantageSpec("gae", kl_coef=0.1, kl_in_reward=True, gamma=0.9, lam=0.8)
    expected = paper_advantages(scores, mask, old, ref, values, 0.9, 0.8, 0.1)
    raw = gae_advantages(gae_inputs(scores, mask, old, ref, values), spec)
    for (row, t), value in expected.items():
        assert raw[row, t].item() == pytest.approx(value, abs=1e-5)
    assert raw[mask == 0].abs().max() == 0  # prompt, the tail of a response ending early, padding
    mean, std = statistics.mean(expected.values()), statistics.stdev(expected.values())
    got = advantages(gae_inputs(scores, mask, old, ref, values), spec)
    for (row, t), value in expected.items():
        assert got[row, t].item() == pytest.approx((value - mean) / std, abs=1e-4)
    assert got[mask == 0].abs().max() == 0


def test_gae_with_gamma_and_lam_one_is_the_score_minus_the_value():
    scores, mask, old, ref, values = ppo_step(seed=1)
    raw = gae_advantages(gae_inputs(scores, mask, old, ref, values), AdvantageSpec("gae"))
    for row, t in zip(*torch.nonzero(mask, as_tuple=True)):
        assert raw[row, t].item() == pytest.approx(float(scores[row] - values[row, t]), abs=1e-5)


def test_the_critics_returns_are_the_advantages_plus_the_values():
    scores, mask, old, ref, values = ppo_step(seed=2)
    spec = AdvantageSpec("gae", gamma=0.99, lam=0.95)
    inputs = gae_inputs(scores, mask, old, ref, values)
    expected = paper_advantages(scores, mask, old, ref, values, 0.99, 0.95, 0.0)
    returns = gae_returns(inputs, spec)
    for (row, t), value in expected.items():
        assert returns[row, t].item() == pytest.approx(value + float(values[row, t]), abs=1e-5)
    assert returns[mask == 0].abs().max() == 0


def test_gae_without_values_is_refused():
    scores, mask, old, ref, _ = ppo_step()
    with pytest.raises(ConfigError, match="algorithm.advantage=gae needs the critic's values"):
        advantages(gae_inputs(scores, mask, old, ref, None), AdvantageSpec("gae"))


def test_rewards_placed_on_turns_are_what_gae_discounts():
    """A multi-turn row: each turn's reward on its last model token (`placed`); with gamma = lam = 1
    and zero values, a token's advantage is the reward still to come, turn by turn."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])  # two model turns, an environment token between
    placed = torch.tensor([[0.0, 1.0, 0.0, 0.0, 2.0]])
    inputs = AdvantageInputs(torch.tensor([3.0]), 1, mask, values=torch.zeros_like(mask), placed=placed)
    assert gae_advantages(inputs, AdvantageSpec("gae")).tolist() == [[3.0, 3.0, 0.0, 2.0, 2.0]]
    inputs.placed = None  # the row's score on its last token
    assert gae_advantages(inputs, AdvantageSpec("gae")).tolist() == [[3.0, 3.0, 0.0, 3.0, 3.0]]
