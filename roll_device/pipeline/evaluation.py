"""Evaluation every `eval.every_n_steps` steps: `eval.samples_per_prompt` responses per held-out
prompt (greedy at `eval.temperature=0`, the default; sampled with `eval.top_p` otherwise, from the
run's seed at every evaluation, so that they differ by the weights alone), rolled out by the
`actor_infer` workers with the current weights and scored by the `reward` workers.

pass@1 is the share of responses that earn the full reward (1.0; for the 0/1 `math` and `exact`
rewards, the mean reward): with k responses a prompt, their mean, avg@k (DAPO reports avg@32 on
AIME). With k > 1, `eval_pass@k` is the share of prompts that at least one of their k responses
solves (Chen et al. 2021's pass@k, estimated from exactly k samples). The records go to
`metrics.jsonl` as lines of their own (`step`, `eval_pass@1`, `eval_pass@<k>`, `eval_reward_mean`,
`eval_size` (prompts), `eval_s`, and `eval_reward_<key>` for the numeric entries of a verl-form
reward's dicts), step 0 before training.
"""

from __future__ import annotations

import time

from roll_device.inputs.settings import EvalSettings
from roll_device.pipeline.generations import GENERATIONS, shown
from roll_device.pipeline.metrics import PASS_KEY
from strategies.base import SamplingConfig


def eval_sampling(
    settings: EvalSettings, max_new_tokens: int, stop_token_ids: list[int], seed: int
) -> SamplingConfig:
    return SamplingConfig(
        n=settings.samples_per_prompt,
        max_tokens=max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        seed=seed,
        stop_token_ids=stop_token_ids,
    )


def solved_share(completions, rewards: list[float]) -> float:
    """The share of the completions' prompts that at least one of their completions solves."""
    solved: dict[int, bool] = {}
    for completion, reward in zip(completions, rewards):
        solved[completion.prompt_index] = solved.get(completion.prompt_index, False) or reward >= 1.0
    return sum(solved.values()) / len(solved)


def evaluate(step, samples, sampling: SamplingConfig, at_step: int, shown_count: int = 0) -> dict:
    """pass@1 (and pass@k) of `samples` answered by `sampling` through the `GrpoStep` `step`'s
    roles; the metrics record, with the first `shown_count` responses under `GENERATIONS`."""
    start = time.perf_counter()
    prompt_ids = [step.encoder.encode(s.prompt, s.chat()) for s in samples]
    completions = step.generate(prompt_ids, sampling)
    scores = step.score(samples, completions)
    rewards = scores.rewards
    record = {
        "step": at_step,
        PASS_KEY: sum(r >= 1.0 for r in rewards) / len(rewards),
        **({f"eval_pass@{sampling.n}": solved_share(completions, rewards)} if sampling.n > 1 else {}),
        "eval_reward_mean": sum(rewards) / len(rewards),
        **scores.means("eval_reward_"),  # verl's extra entries, where its dicts gave some
        "eval_size": len(samples),
        "eval_s": time.perf_counter() - start,
    }
    if shown_count:
        record[GENERATIONS] = shown(step, samples, completions, rewards, shown_count)
    return record
