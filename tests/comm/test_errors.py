"""Bad input to the sender and receiver is refused with a WeightSyncError that names it, before a
sync starts; waits that run out of time say what they waited for. In-process, on the CPU."""

from __future__ import annotations

import pytest

import roll_device as rd
from roll_device.comm import Endpoint, WeightReceiver, WeightSender, plan_sync
from roll_device.comm.buffers import ShmSlot
from roll_device.comm.slot_transport import SLOTS
from roll_device.errors import WeightSyncError
from tests.configs import weight_sync

CPU_PLAN = plan_sync("cpu", "cpu", colocated=False, same_node=True)
QUICK = weight_sync(timeout_s=1)


def test_sender_needs_receivers_its_own_kind_and_options():
    with pytest.raises(WeightSyncError, match="needs at least one receiver, got receivers=0"):
        WeightSender(CPU_PLAN, rd.get_platform("cpu"), 0, QUICK)
    npu_plan = plan_sync("npu", "cpu", colocated=False, same_node=False)
    with pytest.raises(WeightSyncError, match="syncs from a npu trainer but this sender runs on cpu"):
        WeightSender(npu_plan, rd.get_platform("cpu"), 1, QUICK)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'options'"):
        WeightSender(CPU_PLAN, rd.get_platform("cpu"), 1)  # no defaults: the config holds them


def test_receiver_rank_and_kind_are_checked_against_the_sender():
    sender = WeightSender(CPU_PLAN, rd.get_platform("cpu"), 2, QUICK)
    with pytest.raises(
        WeightSyncError, match=r"receiver rank 3 is out of range: the sender expects ranks 1\.\.2"
    ):
        WeightReceiver(sender.endpoint, 3, rd.get_platform("cpu"), timeout_s=1).connect()
    to_npu = WeightSender(
        plan_sync("cpu", "npu", colocated=False, same_node=True), rd.get_platform("cpu"), 1, QUICK
    )
    with pytest.raises(WeightSyncError, match="syncs into npu rollout workers but this one runs on cpu"):
        WeightReceiver(to_npu.endpoint, 1, rd.get_platform("cpu"), timeout_s=1).connect()


def test_a_receiver_of_another_path_is_refused_before_it_joins_and_the_sender_is_told():
    sender = WeightSender(CPU_PLAN, rd.get_platform("cpu"), 1, QUICK)  # bridge, through shared memory
    with pytest.raises(WeightSyncError, match="receiver rank 1 serves the collective path but the trainer's"):
        WeightReceiver(sender.endpoint, 1, rd.get_platform("cpu"), timeout_s=1).connect(path="collective")
    with pytest.raises(WeightSyncError, match="serves the collective path"):
        sender.connect()  # told at once through the control store, not after its wait runs out
    sender.close()


def test_receive_before_connect_is_refused():
    receiver = WeightReceiver(Endpoint("127.0.0.1", 1), 1, rd.get_platform("cpu"))
    with pytest.raises(WeightSyncError, match="receive before connect"):
        receiver.receive(list)


def test_unreachable_sender_and_absent_receivers_time_out_clearly():
    sender = WeightSender(CPU_PLAN, rd.get_platform("cpu"), 1, QUICK)
    with pytest.raises(
        WeightSyncError, match="timed out after 1s waiting for every rollout worker to map the slots"
    ):
        sender.connect()
    made = [slot.path for slot in sender.transport.slots]
    assert len(made) == SLOTS and not any(path.exists() for path in made), "no shared memory left behind"
    sender.close()
    port = sender.endpoint.port
    del sender
    with pytest.raises(
        WeightSyncError, match=f"cannot reach the weight-sync sender at 127.0.0.1:{port} within 1s"
    ):
        WeightReceiver(Endpoint("127.0.0.1", port), 1, rd.get_platform("cpu"), timeout_s=1).connect()


def test_shared_memory_of_another_host_is_named():
    with pytest.raises(WeightSyncError, match="roll-device-weights-elsewhere is not on this host"):
        ShmSlot.attach(("/dev/shm/roll-device-weights-elsewhere", 4096), rd.get_platform("cpu"))


def test_an_aborted_sync_stops_waiting_before_its_timeout():
    """The driver's abort (a receiver was lost) ends a wait that would last `timeout_s`."""
    import threading

    from roll_device.comm import abort_sync

    sender = WeightSender(CPU_PLAN, rd.get_platform("cpu"), 1, weight_sync(timeout_s=600))
    threading.Timer(
        0.2, abort_sync, (sender.endpoint, "a worker of role 'actor_infer' (rank 0) died")
    ).start()
    with pytest.raises(
        WeightSyncError,
        match="aborted while waiting for every rollout worker to map the slots: a worker of role 'actor_infer'",
    ):
        sender.connect()
    sender.close()


def test_an_abort_to_a_store_that_is_gone_returns_at_once_and_prints_nothing(capfd):
    """The driver aborts the sync of a trainer that died, whose store died with it: no c10d retry
    and no C++ stack dump on the terminal (fd 2)."""
    import socket
    import time

    from roll_device.comm import abort_sync

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    abort_sync(Endpoint("127.0.0.1", port), "a worker of role 'actor_train' (rank 0) died", timeout_s=2)
    assert time.monotonic() - started < 1
    out, err = capfd.readouterr()
    assert out == "" and err == "", err
