"""`Platform.device_communicator`: two processes form a group over the kind's collective backend
outside torch.distributed's default group (gloo on the CPU; hccl on the simulated NPU, whose
backend is the simulation's, over gloo: simulated results), and move device tensors through it."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

import roll_device as rd
from tests.isolated import run_isolated

CHECK = "tests.platforms.communicator_checks:member"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("kind", "backend", "device"), [("cpu", "gloo", "cpu"), ("npu-sim", "hccl", "npu:0")]
)
def test_two_processes_broadcast_reduce_and_send_through_the_kind_s_backend(kind, backend, device):
    port = str(free_port())
    with ThreadPoolExecutor(2) as pool:
        ranks = list(pool.map(lambda rank: run_isolated(CHECK, kind, port, str(rank)), range(2)))
    for r in ranks:
        assert r["backend"] == backend and r["device"] == device
        assert r["broadcast"] == [0.0, 10.0, 20.0, 30.0] and r["all_reduce"] == [3.0, 3.0]
        assert not r["default_group"], "the communicator stays outside the default group"
    assert ranks[1]["recv"] == [7.0, 8.0]


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="platform 'cpu': rank 2 is not in a group of 2"):
        rd.get_platform("cpu").runtime.device_communicator("127.0.0.1", free_port(), 2, 2)
