"""`start_cluster(cluster_cfg)`: connect this process to the Ray cluster the config names.

- `local` (default): a new embedded Ray instance with this machine's resources (`num_cpus` to cap
  them, `resources` to declare devices Ray does not detect, such as a plugin kind's), never one
  found on the machine. Inside a Ray job (`RAY_ADDRESS` set, as `submit` does)
  it joins the job's cluster instead.
- `sim`: a simulated multi-node cluster on this machine (`sim_nodes.py`): the head and each entry
  of `nodes`, then `ray.init` on it.
- `remote`: an existing cluster, `address=` (`host:port`, `ray://host:10001` or `auto`); an
  address where nothing answers is refused within seconds, before Ray's own minutes of retries.

A process already connected to Ray keeps that connection: the handle then owns nothing.
The handle is a context manager; `shutdown()` disconnects and ends only what it started.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from roll_device.cluster.sim_nodes import HEAD_NAME, SimNodes, node_args
from roll_device.errors import ConfigError

log = logging.getLogger(__name__)
CLUSTERS = ("local", "sim", "remote")
REACH_TIMEOUT_S = 5.0  # to open a TCP connection to a remote cluster's address


def setting(cfg: Mapping, key: str, default: Any = None) -> Any:
    """`cfg[key]`, or `default` when absent, null or a missing mandatory value (`???`)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        if key not in cfg or OmegaConf.is_missing(cfg, key):
            return default
        value = cfg[key]
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
    else:
        value = cfg.get(key)
    return default if value is None else value


@dataclass
class ClusterHandle:
    """A connection to a Ray cluster and whatever `start_cluster` started for it."""

    name: str
    address: str | None
    dashboard_url: str | None = None
    owns_connection: bool = False
    nodes: SimNodes | None = field(default=None, repr=False)

    def shutdown(self) -> None:
        import ray

        if self.owns_connection and ray.is_initialized():
            ray.shutdown()
        self.owns_connection = False
        if self.nodes is not None:
            self.nodes.stop()
            self.nodes = None
        atexit.unregister(self.shutdown)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def start_cluster(cluster_cfg: Mapping) -> ClusterHandle:
    """Connect to (or start) the cluster of `cluster_cfg` (the `cluster` group of the config)."""
    import ray

    name = setting(cluster_cfg, "name", "local")
    if name not in CLUSTERS:
        raise ConfigError(f"cluster.name='{name}': choose one of {', '.join(CLUSTERS)} (cluster=<name>)")
    address = setting(cluster_cfg, "address")
    if name == "remote" and not address:
        raise ConfigError(
            "cluster=remote needs the cluster's address: cluster.address=<host:port>, "
            "ray://<host>:10001 or auto"
        )
    if ray.is_initialized():
        log.info("roll-device: already connected to Ray; using that cluster")
        return ClusterHandle(name, ray.get_runtime_context().gcs_address)
    include_dashboard = bool(setting(cluster_cfg, "include_dashboard", False))
    if name == "remote":
        check_reachable(address)
        ray.init(address=address)
        return _owned(ClusterHandle(name, address))
    if name == "local":
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:
            ray.init(
                address="local",
                num_cpus=setting(cluster_cfg, "num_cpus"),
                resources=setting(cluster_cfg, "resources"),
                include_dashboard=include_dashboard,
            )
        return _owned(ClusterHandle(name, ray.get_runtime_context().gcs_address))
    return _start_sim(cluster_cfg, include_dashboard)


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """A ConfigError for a cluster address that is malformed or where nothing answers, found in
    seconds (Ray itself retries for minutes before it gives up); `auto` is Ray's to resolve."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"cluster.address={address!r}: give <host>:<port> (the head's GCS port, 6379 unless changed), "
            "ray://<host>:10001 or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(
            f"cluster.address={address}: nothing answers at {host}:{port} within {timeout_s:g}s "
            f"({exc.strerror or type(exc).__name__}): start the cluster there (`ray start --head`) or "
            "correct the address"
        ) from None


def _start_sim(cluster_cfg: Mapping, include_dashboard: bool) -> ClusterHandle:
    import ray

    head, entries = setting(cluster_cfg, "head", {}), setting(cluster_cfg, "nodes", [])
    node_args(head, HEAD_NAME)  # a bad node entry fails before any node starts
    for entry in entries:
        node_args(entry)
    nodes = SimNodes(include_dashboard=include_dashboard)
    handle = _owned(ClusterHandle("sim", nodes.gcs_address, nodes.dashboard_url, nodes=nodes))
    try:
        nodes.start_head(head)
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


def _owned(handle: ClusterHandle) -> ClusterHandle:
    handle.owns_connection = True
    atexit.register(handle.shutdown)
    return handle
