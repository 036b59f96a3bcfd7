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
