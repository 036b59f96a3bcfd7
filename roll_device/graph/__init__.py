"""Device-neutral graphs: a decode step captured once per batch-size bucket, a prefill forward
captured in pieces split at attention once per token-count bucket, both through the platform's
graph API; a batch is padded up to the nearest captured size, replayed, its output sliced.
Platforms without graphs run the same bucket, pad and slice code eagerly. After each weight sync
an engine's graph guard (`guard.py`) checks its graphs against an eager step with the new weights."""

from roll_device.graph.buckets import (
    bucket_for,
    capture_order,
    check_capture_sizes,
    default_capture_sizes,
    default_prefill_sizes,
)
from roll_device.graph.budget import fit_capture_sizes, graphs_per_size
from roll_device.graph.guard import GraphGuard, GuardReport, step_record
from roll_device.graph.prefill import PrefillGraphRunner
from roll_device.graph.runner import DecodeGraphRunner

__all__ = [
    "DecodeGraphRunner",
    "GraphGuard",
    "GuardReport",
    "PrefillGraphRunner",
    "bucket_for",
    "capture_order",
    "check_capture_sizes",
    "default_capture_sizes",
    "default_prefill_sizes",
    "fit_capture_sizes",
    "graphs_per_size",
    "step_record",
]
