"""Ray Compiled Graphs with roll-device's communicator, and Ray Direct Transport over the NPU's
collective backend, on real Ray with simulated NPUs.

One local Ray instance declares two NPUs it does not have; each NPU actor asks for one and runs
with ROLL_DEVICE=npu-sim, so its tensors are `npu` tensors of the simulated NPU and its
communicator runs the platform's `hccl` backend (gloo underneath). Every test checks values AND the
communicator's own counts, so a tensor that slipped through Ray's host channels instead would
fail. Direct transport (in a process of its own, `direct_transport_checks.py`): a producer's method
returns an `npu` tensor with `tensor_transport=<the NPU's backend name>` and the consumer gets it
over the collective group both joined, not from the object store; the group's counts prove it. All results here are SIMULATED
NPU results.
"""

from __future__ import annotations

import os
import time

import pytest
import ray
from ray.dag import InputNode
from ray.experimental.collective import allgather, allreduce, reducescatter

from roll_device.cluster.shm import removed_after
from roll_device.cluster.sim_nodes import AUTH_MODE_ENV
from roll_device.comm.ray_graphs import edge_transport
from roll_device.comm.ray_graphs.communicator import PlatformCommunicator
from tests.comm.direct_transport_checks import NUMEL, STEPS
from tests.comm.graph_actors import SIM_NPU, GraphActor, PausingCommunicator
from tests.isolated import run_isolated

EXECUTIONS = 100
# Ray waits 10 s for a compiled graph's result by default (RAY_CGRAPH_get_timeout); Ray's workers
# run at a low priority, and on two cores shared with another test's processes an execution can
# take seconds.
RESULT_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def ray_npus():
    """A local Ray instance with two (simulated) NPUs, shut down with this module; this process is
    left as found for the tests after it, which start clusters of their own (the variables ray.init
    sets, which `ray start` nodes started later would inherit, go with the file: tests/conftest.py)."""
    import torch

    # Ray fixes its authentication mode once per process, at the first ray.init: a throwaway
    # cluster without tokens, as the simulated clusters of later tests are (cluster/sim_nodes.py).
    os.environ[AUTH_MODE_ENV] = "disabled"
    with removed_after(period_s=0.5):  # the compiled graphs' channel semaphores (sem.hdr*, sem.obj*)
        ray.init(
            address="local", num_cpus=4, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False
        )
        try:
            yield
        finally:
            ray.shutdown()
            # compiling a graph registers Ray's tensor serializer
            ray.util.serialization.deregister_serializer(torch.Tensor)


@pytest.fixture(scope="module")
def npu_actors(ray_npus):
    actors = [ray.remote(GraphActor).options(**SIM_NPU).remote() for _ in range(2)]
    yield actors
    for actor in actors:
        ray.kill(actor)


def _open_communicators(actors) -> list[dict]:
    return [s for stats in ray.get([a.stats.remote() for a in actors]) for s in stats if s["open"]]


def test_npu_tensors_pass_actor_to_actor_through_the_communicator(npu_actors):
    sender, receiver = npu_actors
    with InputNode() as step:
        tensor = sender.make.bind(step).with_tensor_transport(**edge_transport("npu", "npu"))
        dag = receiver.check.bind(tensor, step)
    # Sends and receives run on the communicator's own side streams (Platform.new_stream).
    graph = dag.experimental_compile(_overlap_gpu_communication=True)
    try:
        results = [ray.get(graph.execute(i), timeout=RESULT_TIMEOUT_S) for i in range(EXECUTIONS)]
        sent, received = (_open_communicators([a]) for a in npu_actors)
    finally:
        graph.teardown()
    assert results == [("npu:0", 0.0)] * EXECUTIONS
    assert [(s["sent"], s["platform"]) for s in sent] == [(EXECUTIONS, "npu (simulated)")]
    assert [(r["received"], r["received_bytes"]) for r in received] == [(EXECUTIONS, EXECUTIONS * 4096)]
    # Teardown leaves no process group and no open communicator in either actor.
    assert ray.get([a.process_groups.remote() for a in npu_actors]) == [0, 0]
    assert _open_communicators(npu_actors) == []


def test_a_sender_paused_between_a_tensor_and_the_rest_of_its_value_does_not_hang_the_graph(npu_actors):
    # Ray 2.60 reads inputs in 0.1 s turns and starts a half-read tensor input over, waiting for the
    # next tensor (ray-project/ray#59913): without the communicator's longer turns this hangs at the
    # first execution (it did, at execution 73 of 100 above, in CI).
    communicator = PausingCommunicator.for_actors(npu_actors)
    sender, receiver = npu_actors
    with InputNode() as step:
        tensor = sender.make.bind(step).with_tensor_transport(transport=communicator)
        dag = receiver.check.bind(tensor, step)
    graph = dag.experimental_compile()
    try:
        results = [ray.get(graph.execute(i), timeout=RESULT_TIMEOUT_S) for i in range(3)]
        turns = ray.get([a.read_turn.remote() for a in npu_actors])
    finally:
        graph.teardown()
        communicator.close()
    assert results == [("npu:0", 0.0)] * 3
    assert all(turn == whole_wait >= 10 for turn, whole_wait in turns)


def test_collectives_in_a_graph_across_two_npu_actors(npu_actors):
    communicator = PlatformCommunicator.for_actors(npu_actors)  # ranks in this order
    with InputNode() as step:
        parts = [actor.make.bind(step, 4) for actor in npu_actors]  # [step, step+1, step+2, step+3]
        outputs = [
            allreduce.bind(parts, transport=communicator),
            allgather.bind(parts, transport=communicator),
            reducescatter.bind(parts, transport=communicator),
        ]
        dag = ray.dag.MultiOutputNode(
            [actor.report.bind(out) for per_actor in outputs for actor, out in zip(npu_actors, per_actor)]
        )
    graph = dag.experimental_compile()
    try:
        results = [ray.get(graph.execute(i), timeout=RESULT_TIMEOUT_S) for i in (1, 5)]
        stats = _open_communicators(npu_actors)
    finally:
        graph.teardown()
        communicator.close()
    for result, step in zip(results, (1, 5)):
        part = [float(step + i) for i in range(4)]
        summed = [2 * v for v in part]
        assert result == [
            ("npu:0", values) for values in (summed, summed, part * 2, part * 2, summed[:2], summed[2:])
        ]
    assert sorted((s["rank"], s["collectives"]) for s in stats) == [(0, 6), (1, 6)]
    assert ray.get([a.process_groups.remote() for a in npu_actors]) == [0, 0]


def test_a_cpu_actor_feeds_npu_actors_through_host_staging(npu_actors):
    host = ray.remote(GraphActor).options(num_cpus=0).remote(register=False)
    first, second = npu_actors
    try:
        with InputNode() as step:
            tensor = host.make.bind(step).with_tensor_transport(**edge_transport("cpu", "npu"))
            on_device = first.to_device.bind(tensor).with_tensor_transport(**edge_transport("npu", "npu"))
            dag = second.check.bind(on_device, step)
        graph = dag.experimental_compile()
        try:
            results = [ray.get(graph.execute(i), timeout=RESULT_TIMEOUT_S) for i in range(10)]
            received = _open_communicators([second])
        finally:
            graph.teardown()
    finally:
        ray.kill(host)
    assert results == [("npu:0", 0.0)] * 10
    assert [r["received"] for r in received] == [10]


def test_edges_stage_in_host_memory_unless_one_backend_joins_both_ends():
    communicator = object()
    assert edge_transport("npu", "npu", communicator) == {"transport": communicator}
    assert edge_transport("cuda", "rocm") == {"transport": "accelerator"}  # RCCL answers as nccl
    host = {"transport": "shm", "device": "cpu"}
    assert edge_transport("cpu", "npu") == edge_transport("npu", "cpu") == host
    assert edge_transport("npu", "cuda") == edge_transport("cpu", "cpu") == host


def test_a_method_returns_npu_tensors_to_another_actor_directly():
    out = run_isolated("tests.comm.direct_transport_checks:npu_to_npu")
    nbytes = STEPS * NUMEL * 4
    assert (out["ray_has_it"], out["registered"]) == (False, True)  # a backend Ray lacks, now registered
    assert out["results"] == [["npu:0", 0.0]] * STEPS
    assert (out["sent"]["sent"], out["sent"]["sent_bytes"], out["sent"]["platform"]) == (
        STEPS,
        nbytes,
        "npu (simulated)",
    )
    assert (out["received"]["received"], out["received"]["received_bytes"]) == (STEPS, nbytes)
    assert out["groups_left"] == [0, 0]
    # The ray.util.collective backend's collectives on the same group (rank r holds [r, r+1]).
    assert out["collectives"] == [
        {
            "allreduce": [1.0, 3.0],
            "allgather": [[0.0, 1.0], [1.0, 2.0]],
            "reducescatter": [float(rank * 2 + 1)],
            "broadcast": [1.0, 2.0],
        }
        for rank in range(2)
    ]


def test_teardown_leaves_no_actor_behind(ray_npus, npu_actors):
    from ray._private.state import actors as all_actors

    for actor in npu_actors:
        ray.kill(actor)
    deadline = time.monotonic() + 30  # ray.kill returns before the actor is gone
    while (
        alive := [a for a in all_actors().values() if a["State"] == "ALIVE"]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == []


def test_a_kind_without_its_collective_backend_is_refused_with_what_to_install():
    import roll_device as rd
    from roll_device.errors import ConfigError, MissingPackageError

    with pytest.raises(MissingPackageError) as cuda:
        rd.register_ray_communicator("cuda")  # this torch is a CPU build: no nccl
    assert str(cuda.value) == (
        "platform 'cuda' has no collective backend 'nccl' here: torch.distributed cannot build it "
        "in this process; install a torch build for this kind's GPUs (docs/install.md)"
    )
    with pytest.raises(MissingPackageError) as npu:
        rd.register_ray_communicator("npu")  # no torch_npu here (and no simulation asked for)
    assert str(npu.value).startswith(
        "platform 'npu' has no collective backend 'hccl' here: platform 'npu' needs the package torch_npu, "
        "which could not be imported (ModuleNotFoundError: No module named 'torch_npu'): install torch_npu"
    )
    assert str(npu.value).endswith(
        "or set ROLL_DEVICE=npu-sim to run the NPU code paths on the simulated NPU"
    )
    assert str(npu.value).count("install torch_npu") == 1, "the install hint is said once"
    with pytest.raises(ConfigError, match="platform 'cpu' keeps tensors in host memory"):
        rd.register_ray_communicator("cpu")
