"""The Ray Direct Transport (`rdt`): each bucket is a device tensor returned by a Ray actor call
with a tensor transport, handed to every rollout actor without the object store.

Both ends are Ray actors created with `RDT_ACTOR_OPTIONS` (tensor transport on, and a concurrency
group of their own, so that Ray can run the transfer calls while the actor's main thread is in
`send` or `receive`). At `connect` every end registers a Ray Direct Transport over roll-device's
collective group of its kind (`ray_graphs.transport.register_own_direct_transport`: hccl, nccl,
gloo, ...), the receivers publish their actor handles, and all join one collective group; the
sender, which owns every bucket's reference, records the group with Ray so that its transfers use
it. No driver relays anything: the trainer's actor calls itself for each bucket
(`_outgoing_bucket`, whose returned tensor stays in its RDT store) and passes the reference to
each rollout actor (`_deliver`), which is when Ray sends the tensor over the group; the rollout's
main thread takes it from an inbox. Headers go through the control store, as on the other paths.

Each bucket has a fresh packing buffer (Ray holds it until every receiver has it; a ring could be
overwritten while Ray still sends it), and at most `AHEAD` buckets are in flight.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Iterator

import torch

from roll_device.comm.control import Control, bucket_key
from roll_device.comm.messages import BucketHeader
from roll_device.comm.paths import DIRECT
from roll_device.comm.transport import AHEAD, Setup, receiver_ranks
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

SYNC_GROUP = "weight_sync"  # the actors' concurrency group that runs the transfer calls
RDT_ACTOR_OPTIONS = {"enable_tensor_transport": True, "concurrency_groups": {SYNC_GROUP: 1}}
GROUP_KEY = "rdt/group"


def sync_actor_options(path: str) -> dict:
    """The Ray actor options a trainer and its rollout workers need to sync along `path` (only
    `rdt` needs any)."""
    return dict(RDT_ACTOR_OPTIONS) if path == DIRECT else {}


_outgoing: dict[str, torch.Tensor] = {}  # the sender's buckets until its own call returns them


class _Inbox:
    """Buckets delivered to this process (by Ray, on the transfer thread), by (group, seq, index)."""

    def __init__(self) -> None:
        self._arrived: dict[tuple[str, int, int], torch.Tensor] = {}
        self._changed = threading.Condition()

    def put(self, key: tuple[str, int, int], tensor: torch.Tensor) -> None:
        with self._changed:
            self._arrived[key] = tensor
            self._changed.notify_all()

    def take(self, key: tuple[str, int, int], timeout_s: float) -> torch.Tensor:
        with self._changed:
            if not self._changed.wait_for(lambda: key in self._arrived, timeout_s):
                raise WeightSyncError(
                    f"bucket {key[2]} of weight sync {key[1]} did not arrive by Ray Direct Transport "
                    f"within {timeout_s:g}s"
                )
            return self._arrived.pop(key)


_inbox = _Inbox()


def _outgoing_bucket(actor, key: str) -> torch.Tensor:
    """Run in the sender's actor: the bucket Ray now keeps and sends (a tensor-transport call)."""
    return _outgoing.pop(key)


def _deliver(actor, key: tuple[str, int, int], tensor: torch.Tensor) -> None:
    """Run in a rollout actor once Ray has received the bucket: hand it to the main thread."""
    _inbox.put(key, tensor)


def _current_actor(side: str):
    import ray

    actor = None
    if ray.is_initialized():  # asking the runtime context otherwise would start Ray
        try:
            actor = ray.get_runtime_context().current_actor
        except RuntimeError:
            actor = None
    if actor is None:
        raise WeightSyncError(
            f"weight_sync.path=rdt: the {side} must run in a Ray actor created with "
            "roll_device.comm.rdt_transport.RDT_ACTOR_OPTIONS; use collective (or auto) otherwise"
        )
    return actor


def _join(setup: Setup, platform: Platform, rank: int, group: str) -> str:
    """This process's membership of the sync's collective group; the transport's name."""
    from ray.util import collective

    from roll_device.comm.ray_graphs.transport import register_own_direct_transport

    name = register_own_direct_transport(platform.kind)
    collective.init_collective_group(setup.receivers + 1, rank, backend=name, group_name=group)
    return name


def _actor_key(rank: int) -> str:
    return f"rdt/actor/{rank}"


class RdtSender:
    def __init__(self, control: Control, setup: Setup, platform: Platform) -> None:
        self.control, self.setup, self.platform = control, setup, platform
        self.group: str | None = None
        self._in_flight: deque[list] = deque()

    def connect(self) -> None:
        from ray.experimental.collective.collective import RemoteCommunicatorManager
        from ray.experimental.collective.communicator import CommunicatorHandle

        me = _current_actor("trainer")
        group = f"weight_sync/{uuid.uuid4().hex}"
        self.control.put(GROUP_KEY, group)
        keys = [_actor_key(rank) for rank in receiver_ranks(self.setup)]
        self.actors = [me, *self.control.get_many(keys, "every rollout actor's handle")]
        self.name = _join(self.setup, self.platform, 0, group)
        self.group = group
        RemoteCommunicatorManager.get().add_remote_communicator(
            CommunicatorHandle(self.actors, group, self.name)
        )

    def sends_in_place(self, part: torch.Tensor) -> bool:
        """Every bucket goes as one packed tensor (one transfer per bucket and receiver)."""
        return False

    def buffer(self, seq: int, index: int, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.platform.device())

    def send(self, seq: int, header: BucketHeader, data: list[torch.Tensor]) -> None:
        (packed,) = data  # nothing goes in place: one packed range from offset 0
        while len(self._in_flight) >= AHEAD:
            self._wait_oldest()
        key = (self.group, seq, header.index)
        _outgoing[str(key)] = packed
        self.control.post(bucket_key(seq, header.index), header)
        me, receivers = self.actors[0], self.actors[1:]
        ref = me.__ray_call__.options(tensor_transport=self.name, concurrency_group=SYNC_GROUP).remote(
            _outgoing_bucket, str(key)
        )
        self._in_flight.append(
            [
                actor.__ray_call__.options(concurrency_group=SYNC_GROUP).remote(_deliver, key, ref)
                for actor in receivers
            ]
        )

    def _wait_oldest(self) -> None:
        import ray

        ray.get(self._in_flight.popleft(), timeout=self.control.timeout_s)

    def cancel(self) -> None:
        """Nothing was handed out that needs taking back."""

    def finish(self, seq: int, released: dict[int, list[int] | None]) -> None:
        while self._in_flight:
            self._wait_oldest()

    def used_keys(self, seq: int, buckets: int) -> list[str]:
        return []

    def close(self) -> None:
        if self.group is not None:
            from ray.experimental.collective.collective import RemoteCommunicatorManager
            from ray.util import collective

            RemoteCommunicatorManager.get().remove_remote_communicator(self.group)
            collective.destroy_collective_group(self.group)
            self.group = None


class RdtReceiver:
    lends = False  # device buckets from the inbox are copied out (their reuse is Ray's)

    def __init__(self, control: Control, setup: Setup, platform: Platform, rank: int) -> None:
        self.control, self.setup, self.platform, self.rank = control, setup, platform, rank
        self.group: str | None = None

    def connect(self) -> None:
        self.control.put(_actor_key(self.rank), _current_actor("rollout worker"))
        group = self.control.get(GROUP_KEY, "the sender's collective group")
        _join(self.setup, self.platform, self.rank, group)
        self.group = group

    def buckets(self, seq: int) -> Iterator[tuple[BucketHeader, torch.Tensor | None]]:
        index = 0
        while True:
            header = self.control.get(bucket_key(seq, index), f"bucket {index} of sync {seq}")
            data = None
            if header.error is None:
                data = _inbox.take((self.group, seq, index), self.control.timeout_s)[: header.nbytes]
            yield header, data
            if header.ends:
                return
            index += 1

    def released(self) -> None:
        """Delivered buckets are this receiver's own: nothing to report to the sender."""

    def check_returned(self) -> None:
        """Nothing lent is the sender's: the consumer may keep what it was given."""

    def close(self) -> None:
        if self.group is not None:
            from ray.util import collective

            collective.destroy_collective_group(self.group)
            self.group = None
