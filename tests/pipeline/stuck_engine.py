"""A rollout engine whose set-up never ends (a worker stuck loading, say): the toy engine
(tests/strategies/toy_engine.py) with an `initialize` that sleeps, for the bound on set-up waits."""

from __future__ import annotations

import time

from tests.strategies.toy_engine import ToyEngine, ToySettings


class StuckEngine(ToyEngine):
    """Never finishes `initialize`."""

    def initialize(self, model_path: str, settings: ToySettings, sync_path: str | None = None) -> None:
        time.sleep(3600)
