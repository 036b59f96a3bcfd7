"""benchmarks/vllm_receive.py's split of a profiled receive: each part is the seconds of the
functions it names, the reload's loaders are what its layers took besides the nested parts, and
`rest` is the rest; a profile on a clock the test advances makes the seconds exact."""

import cProfile
import pstats

import pytest

from benchmarks.vllm_receive import ORDER, split

CLOCK = [0.0]


def spend(seconds: float) -> None:
    CLOCK[0] += seconds


def materialize_layer():
    spend(1.0)


def dispatch_cpu_unquantized_gemm():
    spend(4.0)


def _copy_and_restore_kernel_tensors():
    spend(0.5)


def _layerwise_process():
    spend(2.0)  # the loaders' own copies
    materialize_layer()
    dispatch_cpu_unquantized_gemm()
    _copy_and_restore_kernel_tensors()


def start_weight_update():
    spend(0.25)


def finish_weight_update():
    spend(0.125)


def receive():
    start_weight_update()
    spend(3.0)  # the receiver's own work
    for _ in range(2):
        _layerwise_process()
    finish_weight_update()


def test_the_split_takes_nested_parts_apart_and_leaves_the_rest():
    CLOCK[0] = 0.0
    profile = cProfile.Profile(lambda: CLOCK[0])
    profile.runcall(receive)
    parts = split(pstats.Stats(profile).stats, total=CLOCK[0])
    assert {part: parts[part] for part in ORDER} == pytest.approx(
        {
            "transfer": 0.0,
            "loaders": 4.0,
            "materialise": 2.0,
            "repack": 8.0,
            "copy back": 1.0,
            "start": 0.25,
            "finish": 0.125,
            "rest": 3.0,
        }
    )
    assert parts["total"] == pytest.approx(sum(parts[part] for part in ORDER))
