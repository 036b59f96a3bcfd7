"""`run_ranks`: each rank computes with the threads it was given; a rank that ends without a
result (killed, crashed, failed at its start) fails the call at once with its exit code, not at the
end of the timeout (a queue that waited for its result would wait the whole `timeout`), while the
other rank is still running."""

from __future__ import annotations

import pytest

from strategies.training.local_ranks import run_ranks


def test_a_rank_that_dies_fails_the_call_with_its_exit_code():
    with pytest.raises(RuntimeError, match=r"rank 0 with exit code 7 ended without a result"):
        run_ranks("tests.strategies.training.rank_exits:exits", 2, 7, timeout=600)


def test_each_rank_computes_with_the_threads_it_was_given():
    """OMP_NUM_THREADS reaches torch in every rank, though torch started before the rank set it (3:
    neither torch's default on this 2-core host nor the cores shared out among 2 ranks)."""
    ranks = run_ranks("tests.strategies.training.rank_exits:threads", 2, env={"OMP_NUM_THREADS": "3"})
    assert ranks == [(2, 3)] * 2
