"""The one-line refusal every bad input gets, as the tests read it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from roll_device.errors import ConfigError


def one_line_refusal(call: Callable[[], object]) -> str:
    """The ConfigError `call` raises, checked to be one line."""
    with pytest.raises(ConfigError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message
    return message
