"""Bucket choice for captured decode steps: default sizes, validation with clear errors, the
bucket that serves a batch, and the largest-first capture order."""

import pytest

from roll_device.errors import ConfigError
from roll_device.graph import bucket_for, capture_order, check_capture_sizes, default_capture_sizes


def test_default_sizes_are_powers_of_two_then_the_largest_batch():
    assert default_capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert default_capture_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert default_capture_sizes(1) == [1]
    with pytest.raises(ConfigError, match="positive integer"):
        default_capture_sizes(0)


def test_checked_sizes_are_sorted():
    assert check_capture_sizes([8, 1, 4, 16], 16) == [1, 4, 8, 16]
    assert check_capture_sizes([2, 8], 16, reach_max=False) == [2, 8]


@pytest.mark.parametrize(
    "sizes, message",
    [
        ([], "is empty"),
        ([1, 0, 16], "positive integers"),
        ([1, 2.5, 16], "positive integers"),
        ([1, 32], "larger than the largest batch 16"),
        ([1, 4, 4, 16], "twice"),
        ([1, 4, 8], "does not reach the largest batch 16: add 16"),
    ],
)
def test_bad_sizes_are_refused_with_the_fix(sizes, message):
    with pytest.raises(ConfigError, match=message):
        check_capture_sizes(sizes, 16, "rollout.capture_sizes")


def test_bucket_is_the_smallest_size_that_holds_the_batch():
    sizes = [1, 2, 4, 8, 16]
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    with pytest.raises(ValueError, match="exceeds the largest captured size 16"):
        bucket_for(17, sizes)
    with pytest.raises(ValueError, match="at least one row"):
        bucket_for(0, sizes)


def test_capture_order_is_largest_first():
    assert capture_order([1, 4, 2, 16, 8]) == [16, 8, 4, 2, 1]
