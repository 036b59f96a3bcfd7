"""The control channel of a weight sync: small pickled messages by key in a TCP key-value store.

The sender hosts the store (a `torch.distributed.TCPStore` server, any free port); receivers
connect to its (host, port) `Endpoint`. Bucket headers, acknowledgements (with the slots a
receiver has released), shared-memory names, IPC handles and each receiver's final status travel
here; bulk bytes never do. A read blocks on the server until its keys exist: one round trip. The
same store is the rendezvous of the broadcast transports' process group. A wait that runs out of
time raises a WeightSyncError that says what it waited for.

Waits look every `POLL_S` for an abort (`abort_sync(endpoint, reason)`, posted by the driver when a
worker on the other side is lost), so that a sync with a dead peer ends in about a second instead
of after `weight_sync.timeout_s`.

One store may serve several syncs side by side (a sharded sender's links, one per engine node):
each is a namespace of it (`Control.within`), with its own keys and its own group rendezvous; an
abort posted at the store's endpoint ends the waits of all of them.
"""

from __future__ import annotations

import pickle
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from roll_device.errors import WeightSyncError

ABORT_KEY = "sync/abort"
POLL_S = 0.5


@dataclass(frozen=True)
class Endpoint:
    """Where receivers find the sender's control store."""

    host: str
    port: int


class Control:
    """A connection to the control store; `serve` makes the sender's, `connect` a receiver's.

    `post` puts (and `discard` deletes) without waiting, in order, through a connection and a
    thread of its own, so that a busy process (packing or loading the next bucket) does not wait
    for the store; `flush` waits for what was posted and raises what failed."""

    def __init__(
        self,
        store: dist.Store,
        endpoint: Endpoint,
        timeout_s: float,
        namespace: str = "",
        root: dist.Store | None = None,
    ) -> None:
        self.store = store
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.namespace = namespace
        self.root: dist.Store = store if root is None else root  # where aborts are posted
        self._poster: ThreadPoolExecutor | None = None
        self._posted: list[Future] = []

    @classmethod
    def serve(cls, host: str, timeout_s: float) -> Control:
        store = dist.TCPStore(
            host, 0, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return cls(store, Endpoint(host, store.port), timeout_s)

    @classmethod
    def connect(cls, endpoint: Endpoint, timeout_s: float) -> Control:
        return cls(_client(endpoint, timeout_s), endpoint, timeout_s)

    def within(self, namespace: str) -> Control:
        """The sync named `namespace` in this store: keys of its own, this store's aborts."""
        return Control(
            dist.PrefixStore(namespace, self.store), self.endpoint, self.timeout_s, namespace, self.root
        )

    def post(self, key: str, value: Any) -> None:
        self._submit(self._set_posted, key, pickle.dumps(value))

    def discard(self, keys: list[str]) -> None:
        """Delete `keys` as `post` puts: in the background, after what was posted before (a sync's
        keys, once both ends are done with them: nobody waits for their deletion)."""
        self._submit(self._delete_posted, keys)

    def _set_posted(self, key: str, raw: bytes) -> None:
        self._post_store.set(key, raw)

    def _delete_posted(self, keys: list[str]) -> None:
        for key in keys:
            self._post_store.delete_key(key)

    def _submit(self, work, *args) -> None:
        """Run `work(*args)` on the posting thread (made on first use), after what came before;
        raises what an earlier one failed with."""
        if self._poster is None:
            client = _client(self.endpoint, self.timeout_s)
            self._post_store = dist.PrefixStore(self.namespace, client) if self.namespace else client
            self._poster = ThreadPoolExecutor(1, thread_name_prefix="weight-sync-control")
        pending = []
        for future in self._posted:
            if future.done():
                future.result()  # raises what failed
            else:
                pending.append(future)
        self._posted = pending + [self._poster.submit(work, *args)]

    def flush(self) -> None:
        posted, self._posted = self._posted, []
        for future in posted:
            future.result()

    def close(self) -> None:
        self.flush()
        if self._poster is not None:
            self._poster.shutdown()
            self._poster = None

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, pickle.dumps(value))

    def get(self, key: str, waiting_for: str) -> Any:
        """The value under `key`, waiting for it up to the timeout (one round trip)."""
        return self.get_many([key], waiting_for)[0]

    def get_many(self, keys: list[str], waiting_for: str) -> list[Any]:
        """The values under `keys`, waiting for all of them up to the timeout."""
        self.wait(keys, waiting_for)
        with self._timeout(waiting_for):
            return [pickle.loads(raw) for raw in self.store.multi_get(keys)]

    def exists(self, key: str) -> bool:
        """Whether `key` is there now (no waiting)."""
        return self.store.check([key])

    def wait(self, keys: list[str], waiting_for: str) -> None:
        """Wait until `keys` exist: up to the timeout, or until the sync is aborted."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                with self._timeout(waiting_for):
                    self.store.wait(keys, timedelta(seconds=max(min(POLL_S, remaining), 0.001)))
                return
            except WeightSyncError:
                if self.root.check([ABORT_KEY]):
                    reason = pickle.loads(self.root.get(ABORT_KEY))
                    raise WeightSyncError(
                        f"weight sync aborted while waiting for {waiting_for}: {reason}"
                    ) from None
                if time.monotonic() >= deadline:
                    raise

    @contextmanager
    def _timeout(self, waiting_for: str) -> Iterator[None]:
        try:
            yield
        except dist.DistStoreError as exc:
            raise WeightSyncError(
                f"weight sync timed out after {self.timeout_s:g}s waiting for {waiting_for} "
                f"(weight_sync.timeout_s); is the other side alive and syncing?"
            ) from exc


def abort_sync(endpoint: Endpoint, reason: str, timeout_s: float = 5.0) -> None:
    """Tell both ends of the sync served at `endpoint` to stop waiting (best effort: a store that
    is gone has nobody waiting on it). A store that does not take a connection is left alone:
    c10d's client would retry it for `timeout_s` and print a C++ stack dump on each try."""
    if not _listening(endpoint, timeout_s):
        return
    try:
        _client(endpoint, timeout_s).set(ABORT_KEY, pickle.dumps(reason))
    except (WeightSyncError, RuntimeError):
        pass


def _listening(endpoint: Endpoint, timeout_s: float) -> bool:
    """Whether a TCP connection to `endpoint` is accepted within `timeout_s` (a plain socket)."""
    try:
        socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _client(endpoint: Endpoint, timeout_s: float) -> dist.TCPStore:
    try:
        return dist.TCPStore(endpoint.host, endpoint.port, None, False, timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, OSError) as exc:
        raise WeightSyncError(
            f"cannot reach the weight-sync sender at {endpoint.host}:{endpoint.port} within "
            f"{timeout_s:g}s ({exc}): is the trainer's sender open, and the port reachable?"
        ) from exc


def bucket_key(seq: int, index: int) -> str:
    return f"sync/{seq}/bucket/{index}"


def ack_key(seq: int, index: int, rank: int) -> str:
    return f"sync/{seq}/ack/{index}/{rank}"


def done_key(seq: int, rank: int) -> str:
    return f"sync/{seq}/done/{rank}"
