"""A rank function for tests/strategies/training/test_local_ranks.py, run in spawned ranks."""

from __future__ import annotations

import os


def exits(rank: int, code: int) -> None:
    """The rank's process ends at once, without a result (as a killed or crashed one does)."""
    os._exit(code)
