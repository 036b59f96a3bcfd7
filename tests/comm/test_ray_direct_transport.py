"""Ray Direct Transport over the NPU's collective backend, between two simulated-NPU actors.

The producer's method returns an `npu` tensor with `tensor_transport=<the NPU's backend name>`;
the consumer gets it from the producer over the collective group both joined (the platform's
backend: `hccl`, gloo underneath on the simulated NPU), not from the object store. The group's own
counts prove the bytes went through it. SIMULATED NPU results.
"""

from __future__ import annotations

import pytest
import ray

from roll_device.comm.ray_graphs.collective_group import device_group
from tests.comm.graph_actors import SIM_NPU, GraphActor

NUMEL = 1 << 16


@pytest.fixture(scope="module")
def npu_pair(ray_npus):
    actor_class = ray.remote(enable_tensor_transport=True)(GraphActor)
    actors = [actor_class.options(**SIM_NPU).remote(register=False) for _ in range(2)]
    group = device_group(actors, "npu")
    yield actors, group.name
    from ray.experimental.collective import destroy_collective_group

    destroy_collective_group(group)
    for actor in actors:
        ray.kill(actor)


def test_a_method_returns_npu_tensors_to_another_actor_directly(ray_npus, npu_pair):
    (producer, consumer), group = npu_pair
    results = [
        ray.get(
            consumer.check.remote(producer.make.options(tensor_transport=ray_npus).remote(step, NUMEL), step)
        )
        for step in range(3)
    ]
    assert results == [("npu:0", 0.0)] * 3
    sent, received = ray.get([producer.group_stats.remote(group), consumer.group_stats.remote(group)])
    assert (sent["sent"], sent["sent_bytes"], sent["platform"]) == (3, 3 * NUMEL * 4, "npu (simulated)")
    assert (received["received"], received["received_bytes"]) == (3, 3 * NUMEL * 4)


def test_the_npu_backend_is_registered_where_ray_has_none(ray_npus):
    from ray.experimental.rdt.util import DEFAULT_TRANSPORTS
    from ray.util.collective.backend_registry import BackendRegistry

    assert ray_npus not in DEFAULT_TRANSPORTS
    assert BackendRegistry().is_registered(ray_npus)
