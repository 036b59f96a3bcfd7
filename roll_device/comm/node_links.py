"""A sharded sender's links (sharded.py), one per engine node: which engine ranks each serves and by
which transport (`planner.link_plan`: on the bridge, shared memory on the trainer rank's own node and
a gloo broadcast to each other node), and a trainer rank's pieces sent over all of them at once.

Links send at once, one thread each, fed from the rank's export through a queue of `FEED` pieces:
a slow link holds the export back instead of piling up its pieces (a cast makes a copy of each).
A single link is fed by the export itself.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from roll_device.comm.control import Control
from roll_device.comm.messages import SyncStats
from roll_device.comm.options import WeightSyncOptions
from roll_device.comm.paths import BRIDGE
from roll_device.comm.planner import SyncPlan, link_plan
from roll_device.comm.sender import WeightSender
from roll_device.errors import WeightSyncError
from roll_device.platforms import Platform

FEED = 4  # pieces a link may have queued ahead of its sends


@dataclass(frozen=True)
class SyncNodes:
    """Where the ends of a sync run (node ids of the placement): `trainer[r]` trainer rank r's,
    `engines[e - 1]` engine rank e's."""

    trainer: tuple[str, ...]
    engines: tuple[str, ...]


def _by_node(plan: SyncPlan, engines: Sequence[str]) -> dict[str | None, list[int]]:
    """The engine ranks each link serves, by node on the bridge (one link for all otherwise)."""
    if plan.path != BRIDGE:
        return {None: list(range(1, len(engines) + 1))}
    ranks: dict[str | None, list[int]] = {}
    for rank, node in enumerate(engines, 1):
        ranks.setdefault(node, []).append(rank)
    return ranks


class NodeLink:
    """A trainer rank's link to the engine ranks `ranks` (of one node): its sender, and the keys
    of the pieces those ranks need (known once planned)."""

    def __init__(self, sender: WeightSender, ranks: list[int]) -> None:
        self.sender, self.ranks = sender, ranks
        self.keys: set[str] = set()


def open_links(
    control: Control,
    plan: SyncPlan,
    platform: Platform,
    engines: Sequence[str],
    node: str,
    options: WeightSyncOptions,
    host: str,
) -> tuple[list[NodeLink], list[tuple[str, int]]]:
    """A trainer rank's links on node `node` to engine ranks on `engines` (each rank's node, in
    rank order), as namespaces of its store `control`; and per engine rank, the namespace of the
    link that serves it and its rank there (what the receivers read)."""
    links: list[NodeLink] = []
    served: list[tuple[str, int]] = [("", 0)] * len(engines)
    for index, (where, ranks) in enumerate(_by_node(plan, engines).items()):
        namespace = f"link{index}"
        within = control.within(namespace)
        sender = WeightSender(link_plan(plan, where == node), platform, len(ranks), options, host, within)
        links.append(NodeLink(sender, ranks))
        for local, rank in enumerate(ranks, 1):
            served[rank - 1] = (namespace, local)
    return links, served


_END = object()  # the end of a link's feed


def fan_out(
    links: list[NodeLink], pieces: Iterator[tuple[str, torch.Tensor]], version: int
) -> list[SyncStats]:
    """`pieces` over every link at once, each link the pieces its engine ranks need; each link's
    stats. An export that fails is told to every link (each aborts its sync for its receivers) and
    raised; a link that fails is raised once every link has ended."""
    if len(links) == 1:  # every piece is its: the export feeds it straight, no thread or queue
        return [_sent(links[0], pieces, version)]
    feeds = [queue.Queue(maxsize=FEED) for _ in links]
    results: list = [None] * len(links)
    threads = [
        threading.Thread(target=_send_link, args=(link, feed, version, results, i), daemon=True)
        for i, (link, feed) in enumerate(zip(links, feeds, strict=True))
    ]
    for thread in threads:
        thread.start()
    ending: object = _END
    try:
        for key, tensor in pieces:
            for link, feed, thread in zip(links, feeds, threads, strict=True):
                if key in link.keys:
                    _feed(feed, thread, (key, tensor))
    except BaseException as exc:
        ending = exc
        raise
    finally:
        for feed, thread in zip(feeds, threads, strict=True):
            _feed(feed, thread, ending)
        for thread in threads:
            thread.join()
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]
    return results


def _feed(feed: queue.Queue, thread: threading.Thread, item: object) -> None:
    """`item` into a link's feed, unless the link has ended (failed): nobody would take it."""
    while thread.is_alive():
        try:
            feed.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def _sent(link: NodeLink, pieces: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncStats:
    """`pieces` over `link`; its failure names its engine ranks where the link numbers them anew."""
    try:
        return link.sender.send(pieces, version)
    except WeightSyncError as exc:  # its workers named by their rank on the link: say which they are
        if link.ranks == list(range(1, len(link.ranks) + 1)):
            raise
        raise WeightSyncError(f"on the link to engine ranks {link.ranks}: {exc}") from exc


def _send_link(link: NodeLink, feed: queue.Queue, version: int, results: list, index: int) -> None:
    def fed() -> Iterator[tuple[str, torch.Tensor]]:
        while (item := feed.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item

    try:
        results[index] = _sent(link, fed(), version)
    except BaseException as exc:  # noqa: BLE001  (raised by the exporting thread)
        results[index] = exc
