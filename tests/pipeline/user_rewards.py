"""User reward functions the tests name by dotted path (as a user's own module would be)."""

CALLS = {"count": 0}  # per reward-worker process


def length_reward(prompt: str, response: str, answer: str | None) -> float:
    return float(len(response))


def failing_reward(prompt: str, response: str, answer: str | None) -> float:
    raise ValueError(f"cannot score {response!r}")


def failing_after_64_calls(prompt: str, response: str, answer: str | None) -> float:
    """Scores the first 64 samples (step 1 of the default 8 x 8 batch), then raises."""
    CALLS["count"] += 1
    if CALLS["count"] > 64:
        raise ValueError("the grader is out of service")
    return float(response[:1].isdigit())


def nan_after_64_calls(prompt: str, response: str, answer: str | None) -> float:
    """Scores step 1 (the first 64 samples), then returns NaN."""
    CALLS["count"] += 1
    return float("nan") if CALLS["count"] > 64 else float(response[:1].isdigit())


def huge_after_64_calls(prompt: str, response: str, answer: str | None) -> float:
    """Scores step 1, then returns 3e38: finite in float32, but a group of them overflows its mean
    (the advantages, hence the loss, become NaN)."""
    CALLS["count"] += 1
    return 3e38 if CALLS["count"] > 64 else float(response[:1].isdigit())


def verl_compute_score(data_source, solution_str, ground_truth, extra_info=None, source="openai/gsm8k"):
    """verl's form, with verl's dict: 1 for a response given with the fields of test_fields.VERL_ROW
    (its data_source `source`: a keyword reward.kwargs may set), a boolean `acc` and a text `pred`
    beside it."""
    given = (data_source, ground_truth, (extra_info or {}).get("split"))
    score = float(given == (source, "7", "train"))
    return {"score": score, "acc": score > 0, "pred": solution_str}  # as verl's math_dapo answers


def verl_score_without_extra_info(data_source, solution_str, ground_truth):
    return float(len(solution_str))


def verl_dict_without_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": 1.0}


def two_parameter_reward(prompt, response):
    return 1.0


def verl_with_format_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    """verl's form with a keyword of its own (given by reward.kwargs, as verl's reward_kwargs)."""
    return 1.0 if solution_str == ground_truth else format_score


def last_digit(prompt: str, response: str, answer: str | None) -> float:
    """What tests/inputs/reward_models.py's last-digit reward model scores: the text's last character
    that is not a space (the tiny tokenizer has no token for spaces) is a digit."""
    return float((prompt + response).rstrip()[-1:].isdigit())
