"""benchmarks/sync_sharded.py's ratios and summary on small made-up measurements: scaling by rank
count, the transport against memcpy, N links (and N x 2 node links) against as many times one, a rank's peak memory against its
shard plus two buckets, and the worst rank picked from a world's rounds."""

import pytest

from benchmarks.sync_sharded import (
    BUCKET_BYTES,
    engine_seconds,
    link_efficiency,
    memory_bound,
    scaling,
    vs_memcpy,
    worst_rank,
)


def test_scaling_is_each_rank_counts_median_over_the_fewest_ranks():
    ratios = scaling({4: [3.0, 2.4, 2.6], 1: [2.0, 9.0, 1.0], 2: [2.0]})
    assert list(ratios) == [1, 2, 4]
    assert ratios == pytest.approx({1: 1.0, 2: 1.0, 4: 1.3})


def test_vs_memcpy_is_the_median_of_each_rounds_ratio():
    assert vs_memcpy([(1.0, 2.0), (1.0, 1.25), (3.0, 3.0)]) == pytest.approx(0.8)


def test_link_efficiency_compares_n_links_with_n_times_one():
    # 8 GB: one link in 4 s (2 GB/s); two in 2.5 s (3.2 GB/s, 0.8 of 4); four in 2 s (0.5 of 8)
    eff = link_efficiency(8_000_000_000, {1: [4.0], 2: [2.5, 2.5], 4: [2.0]}, one_link=[4.0])
    assert eff == pytest.approx({1: 1.0, 2: 0.8, 4: 0.5})


def test_node_links_compare_with_as_many_times_one_link():
    # two engine nodes, 8 GB each: 1 rank's 2 links in 5 s deliver 3.2 GB/s, 0.8 of 2 x 2 GB/s
    assert link_efficiency(8_000_000_000, {1: [5.0], 2: [8.0]}, one_link=[4.0]) == pytest.approx(
        {1: 0.8, 2: 0.25}
    )


def test_memory_bound_counts_the_shard_and_two_buckets():
    assert memory_bound(300, 100, 100) == pytest.approx(1.0)
    assert memory_bound(150, 100, 100) == pytest.approx(0.5)


def test_a_worlds_engine_and_its_worst_rank_are_read_from_its_rounds():
    def rank(peak: int, shard: int) -> dict:
        return {"seconds": 1.0, "peak_extra": peak, "shard_bytes": shard}

    world = [
        {"rank": 0, "engine": False, "rounds": [rank(10, 1000), rank(BUCKET_BYTES, 1000)]},
        {"rank": 1, "engine": False, "rounds": [rank(2 * BUCKET_BYTES, 10**9)]},  # more, on a larger shard
        {"rank": 2, "engine": True, "rounds": [{"seconds": 0.5}, {"seconds": 0.7}]},
    ]
    assert engine_seconds(world) == [0.5, 0.7]
    assert worst_rank(world) == rank(BUCKET_BYTES, 1000)
    second = {"rank": 3, "engine": True, "rounds": [{"seconds": 0.9}, {"seconds": 0.2}]}
    assert engine_seconds(world + [second]) == [0.9, 0.7]  # each round, the slower engine
