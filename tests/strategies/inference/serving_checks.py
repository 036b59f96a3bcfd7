"""Checks of an engine's request path (strategies/base.py `submit` / `finished`), run on each
engine by its test file (tests/strategies/inference/test_hf_strategy.py, test_vllm_strategy.py)
with its started engine."""

from __future__ import annotations

import time

from strategies.base import Request, SamplingConfig, Served, prompt_sampling

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
TIMEOUT_S = 60.0


def take(engine, count: int) -> list[list[Served]]:
    """The engine's `finished` answers (the non-empty ones) until `count` requests came back."""
    answers, got, deadline = [], 0, time.monotonic() + TIMEOUT_S
    while got < count:
        assert time.monotonic() < deadline, f"{got} of {count} requests came back in {TIMEOUT_S} s"
        if answer := engine.finished(wait_s=1.0):
            answers.append(answer)
            got += len(answer)
    return answers


def served_as_they_come(engine) -> None:
    """Requests submitted at different times, one while another is in flight, are all served,
    each as `generate` serves its prompt alone."""
    greedy = SamplingConfig(max_tokens=6, temperature=0.0)
    engine.submit([Request("first", tuple(PROMPTS[0]), greedy)])
    engine.submit([Request("second", tuple(PROMPTS[1]), greedy)])
    answers = take(engine, 1)
    engine.submit([Request("third", tuple(PROMPTS[2]), greedy)])
    answers += take(engine, 3 - sum(map(len, answers)))
    served = {s.request_id: s for answer in answers for s in answer}
    assert sorted(served) == ["first", "second", "third"]
    for request_id, prompt in zip(["first", "second", "third"], PROMPTS):
        assert served[request_id].completions[0].token_ids == engine.generate([prompt], greedy)[0].token_ids
    assert engine.finished(wait_s=0.1) == []  # nothing in flight: no wait, nothing twice


def short_budgets_finish_first(engine) -> None:
    """Of requests submitted together, the one with the smaller token budget comes back first."""
    long = SamplingConfig(max_tokens=24, temperature=0.0, stop_token_ids=[])
    short = SamplingConfig(max_tokens=2, temperature=0.0)
    engine.submit([Request("long", tuple(PROMPTS[0]), long), Request("short", tuple(PROMPTS[1]), short)])
    answers = take(engine, 2)
    assert [s.request_id for s in answers[0]] == ["short"]
    assert [s.request_id for answer in answers for s in answer] == ["short", "long"]
    assert len(answers[1][0].completions[0].token_ids) > 2


def generate_is_the_request_path(engine) -> None:
    """`generate` equals its prompts' requests served one at a time: a request's samples depend
    on its own seed only, not on what it was batched with."""
    sampling = SamplingConfig(n=2, max_tokens=8, temperature=1.0, seed=13)
    together = engine.generate(PROMPTS, sampling)
    alone = []
    for i, prompt in enumerate(PROMPTS):
        engine.submit([Request(f"alone-{i}", tuple(prompt), prompt_sampling(sampling, i))])
        [[served]] = take(engine, 1)
        alone += [(i, c.sample_index, c.token_ids, c.logprobs) for c in served.completions]
    assert [(c.prompt_index, c.sample_index, c.token_ids) for c in together] == [a[:3] for a in alone]
    assert len({tuple(c.token_ids) for c in together}) == 6  # no two samples share a stream


def changes_wait_for_requests_in_flight(engine) -> None:
    """What changes the engine waits until the requests in flight have finished (a drain), and
    their completions carry the weights version they were made with."""
    engine.submit([Request("in-flight", tuple(PROMPTS[0]), SamplingConfig(max_tokens=16, temperature=0.0))])
    engine.read_weights()  # held: returns only once nothing is in flight
    [served] = engine.finished(wait_s=0.0)
    assert served.request_id == "in-flight" and served.version == engine.weights_version
