"""The sharded sync: every trainer rank sends its own slices, one link per engine node; no rank
holds the whole model.

```python
# trainer rank r (every rank; `layouts`: every rank's `Layout`, gathered once; `nodes`: `SyncNodes`)
sender = ShardedSender(plan, platform, r, layouts, nodes.engines, options, node=nodes.trainer[r])
endpoint = sender.endpoint            # every engine rank gets every trainer rank's endpoint
sender.connect()                      # together with the receivers' connect()
stats = sender.send(local_tensors, version=step)   # (name, this rank's local slice), any order

# engine rank e (1..E)
receiver = ShardedReceiver(endpoints, rank=e, platform=platform)   # needs: None (all whole)
receiver.connect()
stats = receiver.receive(strategy.update_weights)
```

A trainer rank opens one link per engine node (node_links.py), each a `WeightSender` /
`WeightReceiver` pair with everything they keep (buckets, versions, verification, aborts). On the
bridge a link's kind is its
node's (`planner.link_plan`): shared-memory slots to the engine ranks on the trainer rank's own
node, a gloo broadcast (TCP) to those of each other node; nodes are the placement's, so simulated
nodes on one host are nodes of their own. Other paths have one link to every engine rank, by the
plan's transport. A link carries the pieces its node's engine ranks need and no other, and the
links of a rank send at once (one thread each, fed by the rank's export through a short queue), so
N trainer ranks and M engine nodes move their slices over N x M links. The links of a trainer rank
are namespaces of one control store (`Control.within`): the rank has one endpoint, where every
engine rank reads which link serves it, and an abort posted there ends every link's waits.

The plan (`shards.py`) is made once per connection: the senders publish the trainer's layouts,
each receiver its needs, both ends compute the same plan, and a layout that does not fit is refused
at connect, before any byte moves.

A receiver runs one thread per trainer rank's link. A tensor that arrives as one piece covering all
it needs goes to `apply` as the received view (no copy); pieces of a tensor cut across ranks are
copied into an assembly buffer of the tensor's size, which goes to `apply` once complete. The
assembly buffer is the engine's own tensor where the engine names its `targets` (the HF engine: its
parameters) and the sync is not verified: each piece is then copied once, from where it arrived
(on one host, the trainer's shared memory: segments.py) straight into the engine's weight, and
`apply` gets the engine's tensor itself back (a copy onto itself, which torch skips). Otherwise
the buffer is made once per connection and is valid until the next sync. Each link reports to its
sender only after `apply` has returned, with `apply`'s error if it failed, so the trainer learns of
an engine's failure exactly as on one link.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from roll_device.comm.control import Control, Endpoint
from roll_device.comm.messages import SyncStats
from roll_device.comm.node_links import fan_out, open_links
from roll_device.comm.options import WeightSyncOptions
from roll_device.comm.planner import SyncPlan
from roll_device.comm.receiver import Apply, WeightReceiver
from roll_device.comm.shards import Box, Layout, ShardPlan, local_view, plan_shards
from roll_device.comm.timing import Stopwatch
from roll_device.comm.transport import SETUP_KEY
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

LAYOUTS_KEY = "shards/layouts"
LINKS_KEY = "shards/links"  # per engine rank: the namespace of the link that serves it, its rank there


def _need_key(rank: int) -> str:
    return f"shards/need/{rank}"


def merge_stats(stats: list[SyncStats], tensors: int, seconds: float, load_s: float = 0.0) -> SyncStats:
    """One sync's stats from its links' (one version; bytes and buckets added up; the links'
    transports, each once, joined by '+')."""
    versions = {s.version for s in stats}
    if len(versions) != 1:
        raise WeightSyncError(f"the links of one sharded sync carried different versions {sorted(versions)}")
    first = stats[0]
    return SyncStats(
        first.version,
        first.path,
        "+".join(dict.fromkeys(s.transport for s in stats)),
        sum(s.buckets for s in stats),
        tensors,
        sum(s.nbytes for s in stats),
        seconds,
        max(s.export_s for s in stats),
        load_s,
    )


class ShardedSender:
    """Trainer rank `link`'s end: its slices, over one link per engine node."""

    def __init__(
        self,
        plan: SyncPlan,
        platform: Platform,
        link: int,
        layouts: list[Layout],
        engines: Sequence[str],
        options: WeightSyncOptions,
        node: str,
        host: str = "127.0.0.1",
    ) -> None:
        """`engines`: each engine rank's node, in rank order; `node`: this trainer rank's."""
        if not 0 <= link < len(layouts):
            raise WeightSyncError(f"trainer rank {link} has no layout: {len(layouts)} layouts were given")
        if not engines:
            raise WeightSyncError(
                "a sharded sender needs at least one engine rank: `engines` (their nodes) is empty"
            )
        self.link, self.layouts = link, layouts
        self.control = Control.serve(host, options.timeout_s)
        self.control.put(LAYOUTS_KEY, layouts)
        self.node_links, served = open_links(self.control, plan, platform, engines, node, options, host)
        self.control.put(LINKS_KEY, served)
        self.shards: ShardPlan | None = None

    @property
    def endpoint(self) -> Endpoint:
        return self.control.endpoint

    @property
    def version(self) -> int | None:
        return self.node_links[0].sender.version

    def connect(self) -> None:
        """Meet every engine rank, link by link (each engine rank joins one link of every trainer
        rank, in trainer rank order: no link waits on another), learn what each needs, and plan."""
        for node_link in self.node_links:
            node_link.sender.connect()
        ranks = range(1, sum(len(n.ranks) for n in self.node_links) + 1)
        needs = self.control.get_many([_need_key(r) for r in ranks], "every engine rank's needs")
        self.shards = plan_shards(self.layouts, needs)
        for node_link in self.node_links:
            node_link.keys = {key for r in node_link.ranks for key in self.shards.lands[r - 1][self.link]}

    def send(self, local: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
        """Send this rank's slices of trainer step `version`: `local` yields (name, this rank's
        local tensor) for every tensor of its layout."""
        start = time.perf_counter()
        stats = fan_out(self.node_links, self._pieces(local), version)
        return merge_stats(stats, len(self.shards.sends[self.link]), time.perf_counter() - start)

    def _pieces(self, local: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        layout = self.layouts[self.link]
        by_name: dict[str, list] = {}
        for piece in self.shards.sends[self.link]:
            by_name.setdefault(piece.name, []).append(piece)
        seen = set()
        for name, tensor in local:
            shard = layout.get(name)
            if shard is None or tuple(tensor.shape) != shard.box.shape:
                raise WeightSyncError(
                    f"trainer rank {self.link} exported '{name}' {list(tensor.shape)}, which its layout "
                    f"{'does not hold' if shard is None else f'holds as {list(shard.box.shape)}'}: "
                    "reconnect the sync after the model's layout changes"
                )
            seen.add(name)
            for piece in by_name.get(name, []):
                yield piece.key, local_view(tensor, shard, piece)
        if seen != set(layout):
            missing = sorted(set(layout) - seen)[:3]
            raise WeightSyncError(f"trainer rank {self.link}'s export left out {missing} of its layout")

    def close(self) -> None:
        """Close every link (together with its receivers); one that fails to close (an engine rank
        lost) does not keep the others open, and is raised once all were tried."""
        failed = []
        for node_link in self.node_links:
            try:
                node_link.sender.close()
            except RuntimeError as exc:  # a WeightSyncError, or the lost peer's group
                failed.append(exc)
        self.control.close()
        if failed:
            raise failed[0]


def _landing(shards: ShardPlan, rank: int) -> dict[str, list[tuple[int, str, Box]]]:
    """Per tensor engine rank `rank` needs: the (link, piece key, box) of each piece that lands."""
    pieces: dict[str, list[tuple[int, str, Box]]] = {name: [] for name in shards.needs[rank - 1]}
    for link, per_link in enumerate(shards.lands[rank - 1]):
        names = {p.key: p.name for p in shards.sends[link]}
        for key, box in per_link.items():
            pieces[names[key]].append((link, key, box))
    return pieces


def _assembled(shards: ShardPlan, rank: int) -> list[str]:
    """The tensors engine rank `rank` assembles from pieces: all but those that come as one piece
    that is all it needs (handed on as received)."""
    needs = shards.needs[rank - 1]
    return [
        name
        for name, pieces in _landing(shards, rank).items()
        if len(pieces) != 1 or pieces[0][2] != needs[name].box
    ]


def _naming(link: int, endpoint: Endpoint, exc: BaseException) -> WeightSyncError:
    """A link's failure as a WeightSyncError that names its trainer rank; a lost connection to
    its control store (the rank's process is gone) said so."""
    if isinstance(exc, dist.DistNetworkError):
        return WeightSyncError(
            f"trainer rank {link} was lost mid-sync: its weight-sync store at {endpoint.host}:{endpoint.port} "
            f"stopped answering ({exc}); this engine rank may hold a partial update until the next sync"
        )
    return WeightSyncError(f"trainer rank {link}: {exc}")


class _LinkDone:
    """A link has placed every piece of the sync (`error`: or failed)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Assembly:
    """A receiver's tensors of one sync: pieces placed, whole tensors handed on in a queue."""

    def __init__(self, shards: ShardPlan, rank: int, buffers: dict[str, torch.Tensor]) -> None:
        self.needs = shards.needs[rank - 1]
        self.buffers = buffers
        landing = _landing(shards, rank)
        self.where = {(link, key): (name, box) for name, ps in landing.items() for link, key, box in ps}
        self.left = {name: len(pieces) for name, pieces in landing.items()}
        self.lock = threading.Lock()
        self.ready: queue.Queue = queue.Queue()

    def place(self, link: int, key: str, tensor: torch.Tensor) -> None:
        if (link, key) not in self.where:
            return  # a piece another engine rank on this link needs
        name, box = self.where[(link, key)]
        if name not in self.buffers:  # one piece that is the whole need: handed on as received
            self.ready.put((name, tensor))
            return
        self.buffers[name][box.within(self.needs[name].box)].copy_(tensor)
        with self.lock:
            self.left[name] -= 1
            done = self.left[name] == 0
        if done:
            self.ready.put((name, self.buffers[name]))


class ShardedReceiver:
    """An engine rank's end: the link of every trainer rank that serves its node, its tensors
    assembled from their pieces."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        rank: int,
        platform: Platform,
        timeout_s: float = 600.0,
        needs: dict[str, Box] | None = None,
        device: torch.device | None = None,
        targets: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """`targets`: the engine's own tensors by name, where tensors cut across trainer ranks may
        be assembled in place (those of the needed shape, dtype and device); an engine that names
        them copies what it is given, so its links read the trainer's memory in place."""
        if not endpoints:
            raise WeightSyncError("a sharded receiver needs the endpoint of every trainer rank, got none")
        self.endpoints, self.rank, self.platform, self.needs = endpoints, rank, platform, needs
        self.timeout_s, self.device = timeout_s, device
        self.targets = targets or {}
        self.reads_in_place = targets is not None
        self.links: list[WeightReceiver] = []  # one per trainer rank, once connected
        self.shards: ShardPlan | None = None
        self.buffers: dict[str, torch.Tensor] = {}

    @property
    def version(self) -> int | None:
        return self.links[0].version if self.links else None

    def connect(self, path: str | None = None) -> None:
        """Join the link that serves this rank of every trainer rank (in rank order, as every
        engine rank does), say what this rank needs, and plan from the trainer's layouts and every
        engine rank's needs."""
        directories = [Control.connect(endpoint, self.timeout_s) for endpoint in self.endpoints]
        engines = 0
        for directory in directories:
            directory.put(_need_key(self.rank), self.needs)
            engines = self._join(directory, path)
        layouts = directories[0].get(LAYOUTS_KEY, "the trainer's layouts")
        if len(layouts) != len(self.links):
            raise WeightSyncError(
                f"the trainer has {len(layouts)} ranks but engine rank {self.rank} was given "
                f"{len(self.links)} endpoints: pass every trainer rank's endpoint, in rank order"
            )
        ranks = range(1, engines + 1)
        needs = directories[0].get_many([_need_key(r) for r in ranks], "every engine rank's needs")
        self.shards = plan_shards(layouts, needs)
        verified = self.links[0].control.get(SETUP_KEY, "the sender's setup").verify
        wanted = self.shards.needs[self.rank - 1]
        self.buffers = {
            name: self._buffer(wanted[name], in_place=not verified)
            for name in _assembled(self.shards, self.rank)
        }

    def _join(self, directory: Control, path: str | None) -> int:
        """Join the trainer rank's link that serves this rank; returns how many engine ranks the
        trainer rank serves."""
        served = directory.get(LINKS_KEY, "the trainer rank's links")
        if not 1 <= self.rank <= len(served):
            raise WeightSyncError(
                f"receiver rank {self.rank} is out of range: the sender expects ranks 1..{len(served)}"
            )
        namespace, rank = served[self.rank - 1]
        link = WeightReceiver(
            directory.endpoint,
            rank,
            self.platform,
            self.timeout_s,
            self.device,
            self.reads_in_place,
            directory.within(namespace),
        )
        self.links.append(link)
        link.connect(path)
        return len(served)

    def _buffer(self, need, in_place: bool) -> torch.Tensor:
        """Where a tensor cut across ranks is assembled: the engine's own tensor when it may be
        written piece by piece (not verified: a bad bucket must not reach the engine) and fits."""
        device = self.links[0].device
        target = self.targets.get(need.name)
        fits = target is not None and (target.shape, target.dtype, target.device) == (
            torch.Size(need.box.shape),
            need.dtype,
            torch.device(device),
        )
        if in_place and fits and target.is_contiguous():
            return target
        return torch.empty(need.box.shape, dtype=need.dtype, device=device)

    def receive(self, apply: Apply) -> SyncStats:
        """Receive the next sync on every link and hand the assembled tensors to `apply`."""
        if self.shards is None:
            raise WeightSyncError("ShardedReceiver.receive before connect(): connect to the senders first")
        start = time.perf_counter()
        assembly = _Assembly(self.shards, self.rank, self.buffers)
        outcome: list[BaseException | None] = []
        applied = threading.Event()
        results: list = [None] * len(self.links)
        threads = [
            threading.Thread(
                target=self._run_link, args=(link, assembly, applied, outcome, results), daemon=True
            )
            for link in range(len(self.links))
        ]
        for thread in threads:
            thread.start()
        waits = Stopwatch()
        try:
            given = sum(1 for _ in self._consumed(apply, waits.iterate(self._stream(assembly))))
            if given != len(assembly.needs):
                raise WeightSyncError(
                    f"the apply callable returned after {given} of {len(assembly.needs)} tensors: it must "
                    "consume every (name, tensor) it is given"
                )
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
            raise
        finally:
            applied.set()
            for thread in threads:
                thread.join()
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        seconds = time.perf_counter() - start
        return merge_stats(results, len(assembly.needs), seconds, max(seconds - waits.seconds, 0.0))

    @staticmethod
    def _consumed(apply: Apply, stream: Iterator[tuple[str, torch.Tensor]]) -> Iterator[None]:
        """One item per tensor `apply` took from `stream`, once `apply` has returned."""
        taken: list[None] = []

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for item in stream:
                taken.append(None)
                yield item

        apply(counted())
        return iter(taken)

    def _run_link(self, link: int, assembly: _Assembly, applied, outcome, results) -> None:
        placed = False

        def take(named: Iterable[tuple[str, torch.Tensor]]) -> None:
            nonlocal placed
            for key, tensor in named:
                assembly.place(link, key, tensor)
            placed = True
            assembly.ready.put(_LinkDone())
            applied.wait()  # report to the sender only once the engine has loaded (or failed)
            if outcome[0] is not None:
                raise WeightSyncError(f"the engine failed to load the sync: {outcome[0]}")

        try:
            results[link] = self.links[link].receive(take)
        except BaseException as exc:  # noqa: BLE001  (handed to the consuming thread)
            results[link] = _naming(link, self.links[link].endpoint, exc)
            if not placed:
                assembly.ready.put(_LinkDone(results[link]))

    def _stream(self, assembly: _Assembly) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors as they become whole, until every link has placed its pieces."""
        done = 0
        while done < len(self.links):
            item = assembly.ready.get()
            if isinstance(item, _LinkDone):
                if item.error is not None:
                    raise item.error
                done += 1
                continue
            yield item

    def close(self) -> None:
        """Close every link (together with its sender); a link that fails to close (its trainer
        rank lost) does not keep the others open, and is named once all were tried."""
        failed = []
        for link, receiver in enumerate(self.links):
            try:
                receiver.close()
            except RuntimeError as exc:  # a WeightSyncError, or the lost peer's group
                failed.append(_naming(link, receiver.endpoint, exc))
        if failed:
            raise failed[0]


def open_receiver(
    endpoints: Endpoint | list[Endpoint],
    rank: int,
    platform: Platform,
    timeout_s: float = 600.0,
    device: torch.device | None = None,
    targets: dict[str, torch.Tensor] | None = None,
) -> WeightReceiver | ShardedReceiver:
    """The receiver for a trainer's sync: a `WeightReceiver` for one sender's `Endpoint` (the
    trainer's rank 0 sends the whole model), a `ShardedReceiver` for a list of them (every trainer
    rank sends its slices; `targets`: the engine's tensors it may assemble them in). An engine
    that names `targets` copies what it is given: it reads the trainer's memory in place."""
    if isinstance(endpoints, Endpoint):
        return WeightReceiver(
            endpoints, rank, platform, timeout_s, device, reads_in_place=targets is not None
        )
    return ShardedReceiver(list(endpoints), rank, platform, timeout_s, device=device, targets=targets)
