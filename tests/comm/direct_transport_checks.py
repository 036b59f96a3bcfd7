"""Ray Direct Transport between two simulated-NPU actors, run in a process of its own (by
`tests.isolated.run_isolated`): registering a tensor transport changes the driver's Ray for good
(every actor it starts afterwards gets the transport copied in), so the test's driver must not be
the test runner's process.
"""

from __future__ import annotations

import ray

from roll_device.comm.ray_graphs.collective_group import device_group
from roll_device.comm.ray_graphs.transport import register_direct_transport
from tests.comm.graph_actors import SIM_NPU, GraphActor

NUMEL = 1 << 16
STEPS = 3


def npu_to_npu() -> dict:
    """An RDT call per step from a producer to a consumer, both on simulated NPUs: what arrived,
    what the collective group counted, what its collectives gave, and what is left after the group
    is destroyed."""
    from ray.experimental.collective import destroy_collective_group
    from ray.experimental.rdt.util import DEFAULT_TRANSPORTS
    from ray.util.collective.backend_registry import BackendRegistry

    ray.init(address="local", num_cpus=2, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False)
    try:
        name = register_direct_transport("npu")  # before the actors start
        actor_class = ray.remote(enable_tensor_transport=True)(GraphActor)
        producer, consumer = [actor_class.options(**SIM_NPU).remote(register=False) for _ in range(2)]
        group = device_group([producer, consumer], "npu")
        results = [
            ray.get(
                consumer.check.remote(producer.make.options(tensor_transport=name).remote(step, NUMEL), step)
            )
            for step in range(STEPS)
        ]
        sent, received = ray.get(
            [producer.group_stats.remote(group.name), consumer.group_stats.remote(group.name)]
        )
        collectives = ray.get(
            [a.group_collectives.remote(group.name, r) for r, a in enumerate((producer, consumer))]
        )
        destroy_collective_group(group)
        groups_left = ray.get([producer.process_groups.remote(), consumer.process_groups.remote()])
        return {
            "name": name,
            "ray_has_it": name in DEFAULT_TRANSPORTS,
            "registered": BackendRegistry().is_registered(name),
            "results": results,
            "sent": sent,
            "received": received,
            "groups_left": groups_left,
            "collectives": collectives,
        }
    finally:
        ray.shutdown()
