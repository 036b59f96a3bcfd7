"""The control channel of a weight sync: small pickled messages by key in a TCP key-value store.

The sender hosts the store (a `torch.distributed.TCPStore` server, any free port); receivers
connect to its (host, port) `Endpoint`. Bucket headers, acknowledgements, shared-memory names,
IPC handles and each receiver's final status travel here; bulk bytes never do. The same store is
the rendezvous of the broadcast transports' process group. A wait that runs out of time raises a
WeightSyncError that says what it waited for.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from roll_device.errors import WeightSyncError


@dataclass(frozen=True)
class Endpoint:
    """Where receivers find the sender's control store."""

    host: str
    port: int


class Control:
    """A connection to the control store; `serve` makes the sender's, `connect` a receiver's."""

    def __init__(self, store: dist.TCPStore, endpoint: Endpoint, timeout_s: float) -> None:
        self.store = store
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    @classmethod
    def serve(cls, host: str, timeout_s: float) -> Control:
        store = dist.TCPStore(
            host, 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return cls(store, Endpoint(host, store.port), timeout_s)

    @classmethod
    def connect(cls, endpoint: Endpoint, timeout_s: float) -> Control:
        try:
            store = dist.TCPStore(
                endpoint.host, endpoint.port, None, False, timeout=timedelta(seconds=timeout_s)
            )
        except (RuntimeError, OSError) as exc:
            raise WeightSyncError(
                f"cannot reach the weight-sync sender at {endpoint.host}:{endpoint.port} within "
                f"{timeout_s:g}s ({exc}): is the trainer's sender open, and the port reachable?"
            ) from exc
        return cls(store, endpoint, timeout_s)

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, pickle.dumps(value))

    def put_many(self, keys: list[str], values: list[Any]) -> None:
        self.store.multi_set(keys, [pickle.dumps(v) for v in values])

    def get_many(self, keys: list[str]) -> list[Any]:
        """Values of keys that exist already (one round trip)."""
        return [pickle.loads(raw) for raw in self.store.multi_get(keys)]

    def get(self, key: str, waiting_for: str) -> Any:
        """The value under `key`, waiting for it up to the timeout."""
        self.wait([key], waiting_for)
        return pickle.loads(self.store.get(key))

    def wait(self, keys: list[str], waiting_for: str) -> None:
        if not keys:
            return
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout_s))
        except dist.DistStoreError as exc:
            raise WeightSyncError(
                f"weight sync timed out after {self.timeout_s:g}s waiting for {waiting_for} "
                f"(weight_sync.timeout_s); is the other side alive and syncing?"
            ) from exc

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.store.delete_key(key)


def bucket_key(seq: int, index: int) -> str:
    return f"sync/{seq}/bucket/{index}"


def ack_key(seq: int, index: int, rank: int) -> str:
    return f"sync/{seq}/ack/{index}/{rank}"


def done_key(seq: int, rank: int) -> str:
    return f"sync/{seq}/done/{rank}"


def release_key(rank: int, slot: int) -> str:
    """How many times receiver `rank` has released slot `slot` (across syncs)."""
    return f"release/{rank}/{slot}"
