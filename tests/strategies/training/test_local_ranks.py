"""`run_ranks`: ranks that end without a result (killed, crashed, failed at their start) fail the
call at once with their exit codes, not at the end of the timeout (a queue that waited for their
results would wait the whole `timeout`)."""

from __future__ import annotations

import pytest

from strategies.training.local_ranks import run_ranks


def test_ranks_that_die_fail_the_call_with_their_exit_codes():
    with pytest.raises(RuntimeError, match=r"rank 0 with exit code 7.* ended without a result"):
        run_ranks("tests.strategies.training.rank_exits:exits", 2, 7, timeout=600)
