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
