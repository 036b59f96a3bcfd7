"""Device-neutral decode graphs: capture a decode step once per batch-size bucket with the
platform's graph API, pad a batch up to the nearest captured size, replay, slice the output.
Platforms without graphs run the same bucket, pad and slice code eagerly."""

from roll_device.graph.buckets import bucket_for, capture_order, check_capture_sizes, default_capture_sizes
from roll_device.graph.budget import fit_capture_sizes, graphs_per_size
from roll_device.graph.runner import DecodeGraphRunner

__all__ = [
    "DecodeGraphRunner",
    "bucket_for",
    "capture_order",
    "check_capture_sizes",
    "default_capture_sizes",
    "fit_capture_sizes",
    "graphs_per_size",
]
