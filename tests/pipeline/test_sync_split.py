"""Where a step's sync went: the senders' stats merged (sharded: one per trainer rank) and split
into export, cast, transfer and load."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from roll_device.comm import SyncStats
from roll_device.pipeline.sync_split import sync_split


def sender(nbytes: int, seconds: float, export_s: float, cast_s: float) -> dict:
    stats = SyncStats(3, "bridge", "shm", 2, 5, nbytes, seconds, export_s)
    return {**asdict(stats), "cast_s": cast_s, "adapters_only": False}


def test_ranks_sending_at_once_count_their_bytes_and_the_slowest_ones_seconds():
    senders = [sender(100, 0.5, 0.1, 0.05), sender(60, 0.4, 0.2, 0.02)]
    engines = [{"load_s": 0.1}, {"load_s": 0.15}]
    split = sync_split(senders, engines)
    assert (split["version"], split["senders"], split["nbytes"], split["buckets"]) == (3, 2, 160, 4)
    assert (split["seconds"], split["export_s"], split["cast_s"], split["load_s"]) == (0.5, 0.2, 0.05, 0.15)
    assert split["transfer_s"] == pytest.approx(0.5 - 0.2 - 0.05 - 0.15)


def test_one_sender_without_timed_casts():
    split = sync_split(
        [{k: v for k, v in sender(8, 0.2, 0.05, 0).items() if k != "cast_s"}], [{"load_s": 0.1}]
    )
    assert (split["senders"], split["cast_s"], split["transfer_s"]) == (1, 0.0, pytest.approx(0.05))
