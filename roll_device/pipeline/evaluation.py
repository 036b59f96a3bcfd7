"""Evaluation every `eval.every_n_steps` steps: one greedy response per held-out prompt, rolled
out by the `actor_infer` workers with the current weights and scored by the `reward` workers.

pass@1 is the share of prompts whose response earns the full reward (1.0; for the 0/1 `math` and
`exact` rewards, the mean reward). The records go to `metrics.jsonl` as lines of their own
(`step`, `eval_pass@1`, `eval_reward_mean`, `eval_size`, `eval_s`, and `eval_reward_<key>` for the
numeric entries of a verl-form reward's dicts), step 0 before training.
"""

from __future__ import annotations

import time

from roll_device.pipeline.generations import GENERATIONS, shown
from roll_device.pipeline.metrics import PASS_KEY
from strategies.base import SamplingConfig


def greedy(max_new_tokens: int, stop_token_ids: list[int]) -> SamplingConfig:
    return SamplingConfig(n=1, max_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stop_token_ids)


def evaluate(step, samples, max_new_tokens: int, at_step: int, shown_count: int = 0) -> dict:
    """Greedy pass@1 of `samples` (responses up to `max_new_tokens`) through the `GrpoStep`
    `step`'s roles; the metrics record, with the first `shown_count` responses under `GENERATIONS`."""
    start = time.perf_counter()
    prompt_ids = [step.encoder.encode(s.prompt, s.chat()) for s in samples]
    completions = step.generate(prompt_ids, greedy(max_new_tokens, list(step.encoder.tokens.stop)))
    scores = step.score(samples, completions)
    rewards = scores.rewards
    return {
        "step": at_step,
        PASS_KEY: sum(r >= 1.0 for r in rewards) / len(rewards),
        "eval_reward_mean": sum(rewards) / len(rewards),
        **scores.means("eval_reward_"),  # verl's extra entries, where its dicts gave some
        "eval_size": len(rewards),
        "eval_s": time.perf_counter() - start,
        **(
            {GENERATIONS: shown(step.encoder, samples, completions, rewards, shown_count)}
            if shown_count
            else {}
        ),
    }
