"""`start_cluster(cluster)`: connect this process to the Ray cluster the `cluster` section names.

- `local` (default): a new embedded Ray instance with this machine's resources (`num_cpus` to cap
  them, `resources` to declare devices Ray does not detect, such as a plugin kind's), never one
  found on the machine; its helper processes end with the driver even when the driver is killed
  outright (`reaper.py`). Inside a Ray job (`RAY_ADDRESS` set, as `submit` does)
  it joins the job's cluster instead.
- `sim`: a simulated multi-node cluster on this machine (`sim_nodes.py`): the head and each entry
  of `nodes`, then `ray.init` on it.
- `remote`: an existing cluster, `address=` (`host:port`, `ray://host:10001` or `auto`); an
  address where nothing answers is refused within seconds, before Ray's own minutes of retries.

A process already connected to Ray keeps that connection: the handle then owns nothing. The
process keeps its own SIGTERM handler (the `run` command's turns SIGTERM into an interrupt).
The handle is a context manager; `shutdown()` disconnects and ends only what it started, Ctrl-C
and SIGTERM held until Ray's shutdown is done (`signals_deferred`).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Self

from roll_device.cluster.reaper import Watcher, descendants, watch
from roll_device.cluster.settings import ClusterSettings, LocalCluster, RemoteCluster, SimCluster
from roll_device.cluster.sim_nodes import SimNodes
from roll_device.errors import ConfigError, RollDeviceError

log = logging.getLogger(__name__)
REACH_TIMEOUT_S = 5.0  # to open a TCP connection to a remote cluster's address
# Ray waits a fixed 30 s for its own node to register (ray/_private/node.py); a loaded machine can
# miss that once: the embedded node is started again, up to this many tries in all.
LOCAL_START_ATTEMPTS = 3
RAY_START_TIMED_OUT = "timed out during startup"


class ClusterStartError(RollDeviceError, RuntimeError):
    """The embedded Ray node did not start."""

    exit_code = 1


@dataclass
class ClusterHandle:
    """A connection to a Ray cluster and whatever `start_cluster` started for it."""

    name: str
    address: str | None
    dashboard_url: str | None = None
    owns_connection: bool = False
    nodes: SimNodes | None = field(default=None, repr=False)
    watcher: Watcher | None = field(default=None, repr=False)

    def shutdown(self) -> None:
        import ray

        if self.owns_connection and ray.is_initialized():
            with signals_deferred():
                ray.shutdown()
        self.owns_connection = False
        if self.nodes is not None:
            self.nodes.stop()
            self.nodes = None
        if self.watcher is not None:
            self.watcher.release()
            self.watcher = None
        atexit.unregister(self.shutdown)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM held until the block ends, then delivered (the first of them): Ray's
    shutdown, interrupted midway, ends the process with exit 1 before any message is printed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    signums = (signal.SIGINT, signal.SIGTERM)
    previous = {
        signum: signal.signal(signum, lambda signum, frame: held.append(signum)) for signum in signums
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if held:
            signal.raise_signal(held[0])


def start_cluster(cluster: ClusterSettings) -> ClusterHandle:
    """Connect to (or start) the cluster the `cluster` section describes. The process's SIGTERM
    handler is kept (`ray.init` replaces it with a bare `sys.exit(15)`), a SIGTERM during Ray's
    start included."""
    if threading.current_thread() is not threading.main_thread():
        return _connect(cluster)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return _connect(cluster)
    except SystemExit as ended:  # Ray's own handler got a SIGTERM while Ray started
        if ended.code != signal.SIGTERM or not callable(handler):
            raise
        handler(signal.SIGTERM, None)  # the kept handler's SIGTERM (the run's: exit 143, not 15)
        raise
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _connect(cluster: ClusterSettings) -> ClusterHandle:
    import ray

    if ray.is_initialized():
        log.info("roll-device: already connected to Ray; using that cluster")
        return ClusterHandle(cluster.name, ray.get_runtime_context().gcs_address)
    return CONNECT[cluster.name](cluster)


def _join_remote(cluster: RemoteCluster) -> ClusterHandle:
    import ray

    check_reachable(cluster.address)
    context = ray.init(address=cluster.address)
    return _owned(ClusterHandle(cluster.name, cluster.address, dashboard(context)))


def _start_local(cluster: LocalCluster) -> ClusterHandle:
    import ray

    if os.environ.get("RAY_ADDRESS"):
        context = ray.init()
        return _owned(ClusterHandle(cluster.name, ray.get_runtime_context().gcs_address, dashboard(context)))
    before = descendants()
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            context = ray.init(
                address="local",
                num_cpus=cluster.num_cpus,
                resources=cluster.resources,
                include_dashboard=cluster.include_dashboard,
            )
            break
        except Exception as exc:  # Ray raises a bare Exception when its 30 s start wait runs out
            ray.shutdown()  # what this try started
            if RAY_START_TIMED_OUT not in str(exc):
                raise
            log.warning(
                "roll-device: Ray's node start timed out (try %d of %d)", attempt, LOCAL_START_ATTEMPTS
            )
    else:
        raise ClusterStartError(
            f"the embedded Ray node did not start in {LOCAL_START_ATTEMPTS} tries of Ray's 30 s each (this "
            "machine is busy, or Ray cannot start here: see /tmp/ray/session_latest/logs): run again "
            "once the load is lower, or lower cluster.num_cpus"
        )
    watcher = watch(descendants() - before)
    address = ray.get_runtime_context().gcs_address
    return _owned(ClusterHandle(cluster.name, address, dashboard(context), watcher=watcher))


def dashboard(context) -> str | None:
    """The dashboard's address from what `ray.init` returned (None where no dashboard runs)."""
    url = getattr(context, "dashboard_url", None)
    return f"http://{url}" if url and "://" not in url else url or None


def check_reachable(
    address: str, timeout_s: float = REACH_TIMEOUT_S, setting: str = "cluster.address"
) -> None:
    """A ConfigError for a cluster address (given as `setting`) that is malformed or where nothing
    answers, found in seconds (Ray itself retries for minutes before it gives up); `auto` is Ray's
    to resolve."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"{setting}={address!r}: give <host>:<port> (the head's GCS port, 6379 unless changed), "
            "ray://<host>:10001 or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"{setting}={address}: nothing answers at {host}:{port} within {timeout_s:g}s "
            f"({exc.strerror or type(exc).__name__}): start the cluster there (`ray start --head`) or "
            "correct the address"
        ) from None


def _start_sim(cluster: SimCluster) -> ClusterHandle:
    import ray

    nodes = SimNodes(include_dashboard=cluster.include_dashboard)
    handle = _owned(ClusterHandle("sim", nodes.gcs_address, nodes.dashboard_url, nodes=nodes))
    (head_name, head), *entries = cluster.entries()
    try:
        nodes.start_head(head_name, head)
        ray.init(address=nodes.gcs_address)
        handle.owns_connection = True

        def alive() -> int:
            return sum(1 for node in ray.nodes() if node["Alive"])

        nodes.add_nodes(entries, alive)
        nodes.wait_for_dashboard()
    except BaseException:
        handle.shutdown()
        raise
    return handle


# how each `cluster` option connects, by its name
CONNECT: dict[str, Callable[..., ClusterHandle]] = {
    "local": _start_local,
    "sim": _start_sim,
    "remote": _join_remote,
}


def _owned(handle: ClusterHandle) -> ClusterHandle:
    handle.owns_connection = True
    atexit.register(handle.shutdown)
    return handle
