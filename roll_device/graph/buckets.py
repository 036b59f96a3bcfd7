"""Buckets for captured steps: batch sizes for decode steps, token counts for packed prefills;
which sizes to capture, in which order, and which captured size serves a batch (the smallest that
holds it; the rows or tokens above the batch are padding)."""

from __future__ import annotations

from collections.abc import Iterable

from roll_device.errors import ConfigError

LARGEST_PREFILL_BUCKET = 1024  # tokens; larger prefills run eagerly


def default_capture_sizes(max_batch: int) -> list[int]:
    """Powers of two below `max_batch`, then `max_batch` itself: at most half of a bucket is padding."""
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise ConfigError(f"the largest batch must be a positive integer, got {max_batch!r}")
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch]


def default_prefill_sizes(max_tokens: int) -> list[int]:
    """Powers of two from 16 tokens up to `max_tokens` or 1,024, whichever is smaller, and that."""
    largest = min(max_tokens, LARGEST_PREFILL_BUCKET)
    sizes, size = [], 16
    while size < largest:
        sizes.append(size)
        size *= 2
    return sizes + [largest]


def check_capture_sizes(
    sizes: Iterable,
    max_batch: int,
    key: str = "capture_sizes",
    reach_max: bool = True,
    limit: str = "the largest batch",
) -> list[int]:
    """`sizes` validated against `max_batch` and sorted ascending. With `reach_max` the largest
    must be `max_batch`, so that every batch up to it has a bucket. Raises `ConfigError` naming
    `key` and the fix; `limit` says what `max_batch` is."""
    sizes = list(sizes)
    if not sizes:
        raise ConfigError(f"{key} is empty: give at least one batch size, or null for the default")
    for size in sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"{key} must hold positive integers, got {size!r} in {sizes}")
        if size > max_batch:
            raise ConfigError(
                f"{key} has {size}, larger than {limit} {max_batch}: drop it or raise the batch limit"
            )
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"{key} lists a size twice: {sizes}")
    if reach_max and max(sizes) != max_batch:
        raise ConfigError(
            f"{key} {sorted(sizes)} does not reach the largest batch {max_batch}: add {max_batch} "
            f"or lower the batch limit to {max(sizes)}"
        )
    return sorted(sizes)


def bucket_for(rows: int, sizes: list[int]) -> int:
    """The smallest of the ascending `sizes` that holds `rows`."""
    if rows < 1:
        raise ValueError(f"a batch needs at least one row, got {rows}")
    for size in sizes:
        if size >= rows:
            return size
    raise ValueError(f"a batch of {rows} rows exceeds the largest captured size {sizes[-1]}: split it first")


def capture_order(sizes: list[int]) -> list[int]:
    """Largest first: later (smaller) graphs reuse the shared pool's blocks freed by earlier ones."""
    return sorted(sizes, reverse=True)
