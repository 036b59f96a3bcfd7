"""Weight sync from a trainer to rollout workers, on any pair of device kinds.

`plan_sync` picks the path from the two roles' kinds and placement (colocated:
IPC handles or shared memory; collective: a broadcast over the kind's backend; bridge: host
staging across kinds; rdt, only when asked for: Ray Direct Transport between Ray actors started
with `sync_actor_options(path)`). `WeightSender` (trainer rank 0) and `WeightReceiver` (each rollout worker)
move bucketed, versioned, optionally verified weights along it; with a sharded trainer,
`ShardedSender` (every trainer rank, its own slices over one link per engine node: shared memory
on its own node, gloo to the others; `SyncNodes` says where each end runs) and `ShardedReceiver`
(each rollout worker, the link of every trainer rank that serves its node; `open_receiver` picks)
do, by the plan of slices in shards.py. `weights_hash` hashes named
tensors the same way on both ends. See docs/weight-sync.md.
"""

from roll_device.comm.control import Endpoint, abort_sync
from roll_device.comm.hashing import weights_hash
from roll_device.comm.messages import SyncStats
from roll_device.comm.node_links import SyncNodes
from roll_device.comm.options import WeightSyncOptions
from roll_device.comm.paths import PATHS
from roll_device.comm.planner import SyncPlan, plan_sync
from roll_device.comm.rdt_transport import sync_actor_options
from roll_device.comm.receiver import WeightReceiver
from roll_device.comm.sender import WeightSender
from roll_device.comm.sharded import ShardedReceiver, ShardedSender, open_receiver

__all__ = [
    "PATHS",
    "Endpoint",
    "ShardedReceiver",
    "ShardedSender",
    "SyncNodes",
    "SyncPlan",
    "SyncStats",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncOptions",
    "abort_sync",
    "open_receiver",
    "plan_sync",
    "sync_actor_options",
    "weights_hash",
]
