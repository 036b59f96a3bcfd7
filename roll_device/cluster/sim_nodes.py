"""The simulated cluster's nodes: `ray start --block` processes on this machine, one per node.

Each node declares the accelerators of its config entry (`num_gpus`, `resources: {NPU: 4}`, an
optional `accelerator_type`) without having them; a node that declares any carries the label
`roll-device/simulated=true`.
The cluster keeps to itself: its own temp dir (so `ray.init()` elsewhere on the machine never finds
it), a free port for every service, the dashboard only when asked. Nodes start one after another
(nodes sharing a session directory must not race for socket names). `stop()` sends SIGTERM to each
`ray start` process, which takes its node's processes down, and removes the temp dir; on Linux a
node also gets SIGTERM when the process that started it dies without stopping it.

Node entries (`SimNode` in settings.py): `name` (required except for the head), `num_cpus`,
`num_gpus`, `resources` (custom resources, never CPU or GPU), `accelerator_type` (e.g.
`AMD-Instinct-MI300X` for GPUs of another vendor). Ray maps 127.0.0.1 to the machine's own
address; every node is on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from roll_device.cluster.inventory import (
    SIMULATED_LABEL,
)
from roll_device.cluster.settings import SimNode
from roll_device.errors import RollDeviceError

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
AUTH_MODE_ENV = "RAY_AUTH_MODE"
# Ask Linux for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG = 1), then become the command:
# a driver killed outright leaves no node behind.
EXEC_WITH_PARENT_DEATH_SIGNAL = (
    "import ctypes, os, signal, sys; ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


class SimClusterError(RollDeviceError, RuntimeError):
    """A node of the simulated cluster did not start."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_args(name: str, node: SimNode) -> list[str]:
    """`ray start` arguments for one node of the sim cluster."""
    args = [
        f"--node-name={name}",
        f"--num-cpus={node.num_cpus}",
        f"--num-gpus={node.num_gpus}",
        "--node-ip-address=127.0.0.1",
        "--min-worker-port=0",
        "--max-worker-port=0",
        f"--dashboard-agent-listen-port={free_port()}",
        "--disable-usage-stats",
        "--block",
    ]
    resources = node.declared_resources()
    if resources:
        args.append(f"--resources={json.dumps(resources)}")
    if node.simulated:
        args.append(f"--labels={SIMULATED_LABEL}=true")
    return args


class SimNodes:
    """The `ray start` processes of one simulated cluster."""

    def __init__(self, include_dashboard: bool = False) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rd-sim-", dir="/tmp"))  # short: socket paths
        self.gcs_port = free_port()
        self.gcs_address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_port = free_port()
        self.include_dashboard = include_dashboard
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}" if include_dashboard else None
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        ray_cli = Path(sys.executable).with_name("ray")
        command = [str(ray_cli)] if ray_cli.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
        if sys.platform.startswith("linux"):  # the node ends when the process that started it dies
            command = [sys.executable, "-c", EXEC_WITH_PARENT_DEATH_SIGNAL, *command]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        # A throwaway cluster on this machine: no token authentication, whatever ~/.ray holds (a head
        # finding ~/.ray/auth_token would demand a token its worker nodes never send), unless this
        # process asks for it (RAY_AUTH_MODE=token: every node then reads the token it reads).
        if env.get(AUTH_MODE_ENV) != "token":
            env[AUTH_MODE_ENV] = "disabled"
        # Jobs on this cluster run `python`: make it this interpreter.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        with open(self.temp_dir / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                [*command, "start", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.procs.append((name, proc))
        return proc

    def start_head(self, name: str, node: SimNode) -> None:
        args = node_args(name, node) + [
            "--head",
            f"--port={self.gcs_port}",
            f"--temp-dir={self.temp_dir}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-port={self.dashboard_port}",
            f"--include-dashboard={'true' if self.include_dashboard else 'false'}",
        ]
        if self.include_dashboard:
            args.append("--dashboard-host=127.0.0.1")
        proc = self._spawn(name, args)
        self._wait(name, proc, self._gcs_listening)

    def add_nodes(self, entries: list[tuple[str, SimNode]], alive_nodes: Callable[[], int]) -> None:
        """Start the worker nodes together (each in a temp dir of its own, so that they do not
        race for socket names) and wait until the cluster counts them all alive."""
        want = alive_nodes() + len(entries)
        started = []
        for number, (name, node) in enumerate(entries, 1):
            temp_dir = self.temp_dir / f"n{number}"
            temp_dir.mkdir()
            args = node_args(name, node) + [f"--address={self.gcs_address}", f"--temp-dir={temp_dir}"]
            started.append((name, self._spawn(name, args)))
        for name, proc in started:
            self._wait(name, proc, lambda: alive_nodes() >= want)

    def wait_for_dashboard(self) -> None:
        if self.dashboard_url is None:
            return
        name, proc = self.procs[0]
        self._wait(f"{name} dashboard", proc, self._dashboard_answers)

    def _gcs_listening(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.gcs_port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def _dashboard_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2) as reply:
                return reply.status == 200
        except urllib.error.HTTPError as refusal:  # it answers, but wants a token (RAY_AUTH_MODE=token)
            return refusal.code == 401
        except OSError:
            return False

    def _wait(self, name: str, proc: subprocess.Popen, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {proc.returncode}" if proc.poll() is not None else "timed out"
                log = (self.temp_dir / f"{name.split()[0]}.log").read_text(errors="replace")[-3000:]
                raise SimClusterError(f"sim cluster node '{name}' did not start ({state}):\n{log}")
            time.sleep(0.2)

    def stop(self) -> None:
        """End every node this object started (workers first, the head last)."""
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: only this node's processes
                proc.wait()
        self.procs = []
        shutil.rmtree(self.temp_dir, ignore_errors=True)
