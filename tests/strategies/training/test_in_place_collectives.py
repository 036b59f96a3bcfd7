"""The in-place all-gather, reduce-scatter and whole-tensor gather (a backend whose collectives
copy the whole tensor: gloo) give what torch's own give, on 2 gloo ranks; the gather to one rank
gives it the whole tensor by receives alone and the other rank None, after sends alone. The FSDP2
trainer uses them on the CPU, so tests/strategies/training/test_fsdp.py checks them inside a
trainer too."""

from strategies.training.local_ranks import run_ranks


def test_in_place_collectives_equal_torchs():
    for rank in run_ranks("tests.strategies.training.in_place_checks:compare", 2):
        assert rank and all(rank.values()), rank
