"""Simulated hosts with a network of their own, for measuring links between hosts on one machine.

Each simulated host is a Linux network namespace joined to a hub (the namespace the benchmark runs
in, a private one: `private_network`) by a veth pair: the host's NIC `eth0` at 10.90.<i+1>.2 and the
hub's end at 10.90.<i+1>.1, the hub routing between hosts. A host's NIC may send at most `rate`
(the kernel's token-bucket filter, `tc ... tbf`), as a real host's link does; what a host receives
is not limited. A thread joins host i with `enter(hosts.namespace(i))`: its calling thread and the threads
that thread starts later (sockets made before stay in the network they were made in).

Needs `unshare`, `nsenter`, `ip` and `tc` (util-linux and iproute2) and a kernel that lets the
benchmark make network namespaces (in a user namespace of its own, or as root).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

MARK = "ROLL_DEVICE_PRIVATE_NETWORK"  # set in a benchmark re-run in a network namespace of its own
CLONE_NEWNET = 0x40000000
NIC = "eth0"  # every host's one NIC
TOOLS = ("unshare", "nsenter", "ip", "tc")
UNSHARE = ["unshare", "--user", "--map-root-user", "--net"]
PROBE = (  # what a host needs from the kernel: a veth link and a token bucket on it
    "ip link add probe0 type veth peer name probe1"
    " && tc qdisc add dev probe0 root tbf rate 1gbit burst 64kb latency 100ms"
)


def unavailable() -> str | None:
    """What keeps simulated hosts from being made here (a tool missing, or the kernel refusing a
    user and network namespace), or None."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"simulated hosts need {', '.join(missing)} (util-linux, iproute2): install them"
    probe = subprocess.run([*UNSHARE, "sh", "-c", PROBE], capture_output=True, text=True, check=False)
    if probe.returncode:
        return (
            f"simulated hosts need a user and network namespace with veth links and tc's tbf, which "
            f"this kernel refused ({probe.stderr.strip()}): run where unprivileged user namespaces "
            f"are allowed (or as root) on a kernel with veth and sch_tbf"
        )
    return None


def private_network() -> None:
    """Re-run this process's command in a user and network namespace of its own, unless it runs in
    one already (there: bring up its loopback and return); exits with the re-run's status, or with 2
    and one line saying what is missing where simulated hosts cannot be made."""
    if os.environ.get(MARK):
        _run(["ip", "link", "set", "lo", "up"])
        return
    if reason := unavailable():  # one line, as the project's commands refuse what they cannot run
        print(reason, file=sys.stderr)
        sys.exit(2)
    command = [*UNSHARE, "--", sys.executable, *sys.orig_argv[1:]]
    sys.exit(subprocess.run(command, env={**os.environ, MARK: "1"}, check=False).returncode)


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"simulated hosts: `{' '.join(command)}` failed: {done.stderr.strip()}")


def address(index: int) -> str:
    """Host `index`'s address, on its NIC."""
    return f"10.90.{index + 1}.2"


def _gateway(index: int) -> str:
    """The hub's address on host `index`'s link: the host's route to the others."""
    return f"10.90.{index + 1}.1"


@dataclass
class Hosts:
    """Simulated hosts, host i's NIC sending at most `rates[i]` bits per second (None: no limit),
    their hub the calling thread's network. Close to take them down (from any thread)."""

    rates: list[int | None]
    holders: list[subprocess.Popen] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.hub = os.open("/proc/thread-self/ns/net", os.O_RDONLY)  # kept while a thread enters a host
        with open("/proc/sys/net/ipv4/ip_forward", "w") as forward:
            forward.write("1")
        for index, rate in enumerate(self.rates):
            self.holders.append(_holder())
            self._wire(index, rate)

    def namespace(self, index: int) -> str:
        return f"/proc/{self.holders[index].pid}/ns/net"

    def _wire(self, index: int, rate: int | None) -> None:
        hub, inside = f"hub{index}", ["nsenter", f"--net={self.namespace(index)}"]
        _run(
            self._in_hub(
                "link", "add", hub, "type", "veth", "peer", "name", NIC, "netns", self.namespace(index)
            )
        )
        _run(self._in_hub("addr", "add", f"{_gateway(index)}/24", "dev", hub))
        _run(self._in_hub("link", "set", hub, "up"))
        for command in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "addr", "add", f"{address(index)}/24", "dev", NIC],
            ["ip", "link", "set", NIC, "up"],
            ["ip", "route", "add", "default", "via", _gateway(index)],
        ):
            _run(inside + command)
        if rate is not None:  # a bucket of 1 ms at the rate (at least 64 KiB): no burst above it
            burst = max(rate // 8 // 1000, 64 << 10)
            _run(
                inside
                + ["tc", "qdisc", "add", "dev", NIC, "root", "tbf", "rate", f"{rate}bit"]
                + ["burst", str(burst), "latency", "100ms"]
            )

    def _in_hub(self, *arguments: str) -> list[str]:
        """An `ip` command run in the hub's network, whichever network this thread is in."""
        return ["nsenter", f"--net=/proc/{os.getpid()}/fd/{self.hub}", "ip", *arguments]

    def close(self) -> None:
        """Each host's link deleted (both ends: the kernel would delete them later, after its
        namespace has gone, and a next `Hosts` could meet the names), then its holder ended."""
        for index in range(len(self.holders)):
            subprocess.run(self._in_hub("link", "del", f"hub{index}"), capture_output=True, check=False)
        for holder in self.holders:
            holder.stdin.close()  # its input ends: it ends
            holder.wait()
        os.close(self.hub)


def _holder() -> subprocess.Popen:
    """A process that holds a new network namespace, once it is made (it says so), until its input
    ends: when it is closed, or when this process ends, so a benchmark killed midway leaves none."""
    holder = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "echo made; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if holder.stdout.readline().strip() != "made":
        holder.kill()
        raise RuntimeError("simulated hosts: `unshare --net` could not make a network namespace")
    holder.stdout.close()
    return holder


def enter(namespace: str) -> None:
    """This thread (and the threads it starts) into the simulated host whose namespace is
    `namespace`; gloo groups made after it bind to the host's NIC."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = NIC
