"""benchmarks/host_network.py's simulated hosts, made for real in a user and network namespace of the
test's own (a subprocess): a host reaches another only through the hub, from its own address, a
thread that enters a host stays there, a host's NIC carries the token bucket it was given, and
closing takes every link down; a machine without the tools is refused in one line. And link_network.py's
ratios on made-up measurements, two engine hosts' against their trainers' NICs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import host_network
from benchmarks.link_network import summarize

ROOT = Path(__file__).resolve().parents[2]
UNAVAILABLE = host_network.unavailable()  # what keeps simulated hosts from being made here


def _ip(namespace: str, *command: str) -> str:
    return subprocess.run(
        ["nsenter", f"--net={namespace}", *command], capture_output=True, text=True, check=True
    ).stdout


def probe() -> dict:
    """Run in a private network: two hosts, host 0's NIC at 800 Mbit/s; a message from host 0 to
    a server on host 1; what the server saw, each host's addresses, host 0's queueing discipline,
    the hub's links before and after close."""
    import socket
    import threading

    host_network.private_network()
    hub = os.open("/proc/self/ns/net", os.O_RDONLY)  # this thread's until it enters host 0
    hosts = host_network.Hosts([800_000_000, None])
    seen: dict = {"hub_links": _ip(f"/proc/{os.getpid()}/fd/{hub}", "ip", "-o", "link")}
    listening = threading.Event()

    def serve() -> None:
        host_network.enter(hosts.namespace(1))
        with socket.create_server((host_network.address(1), 0)) as server:
            seen["port"] = server.getsockname()[1]
            listening.set()
            connection, peer = server.accept()
            seen["peer"], seen["got"] = peer[0], connection.recv(16).decode()
            connection.close()

    server = threading.Thread(target=serve)
    server.start()
    assert listening.wait(10)
    host_network.enter(hosts.namespace(0))
    with socket.create_connection((host_network.address(1), seen["port"]), timeout=10) as client:
        client.sendall(b"weights")
    server.join(10)
    seen["addresses"] = [_ip(hosts.namespace(i), "ip", "-o", "-4", "addr") for i in range(2)]
    seen["qdisc"] = [
        _ip(hosts.namespace(i), "tc", "qdisc", "show", "dev", host_network.NIC) for i in range(2)
    ]
    hosts.close()
    seen["hub_links_after"] = _ip(f"/proc/{os.getpid()}/fd/{hub}", "ip", "-o", "link")
    return seen


@pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))
def test_simulated_hosts_reach_each_other_through_the_hub_with_the_nic_rate_they_were_given():
    code = "import json; from tests.benchmarks.test_link_network import probe; print(json.dumps(probe()))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["got"] == "weights"
    assert seen["peer"] == host_network.address(0)  # from host 0's own NIC, routed by the hub
    assert f"inet {host_network.address(0)}/24" in seen["addresses"][0]
    assert host_network.address(1) not in seen["addresses"][0]  # each host holds its address only
    assert "tbf" in seen["qdisc"][0] and "rate 800Mbit" in seen["qdisc"][0]
    assert "tbf" not in seen["qdisc"][1]  # no limit asked: none set
    assert "hub0" in seen["hub_links"] and "hub1" in seen["hub_links"]
    assert "hub" not in seen["hub_links_after"]


def test_each_case_compares_its_links_with_n_times_its_baselines_one_link():
    # 8 GB a sync to each engine: unlimited, one link 4 s, two 4 s (no gain: 0.5); limited, one link
    # 16 s, two 8 s (1.0); two engines at the limited rate, one trainer 32 s (its NIC carries the
    # bytes twice: busy, 1.0), two trainers 20 s (2 x 8 GB / 20 s over 2 x 0.5 GB/s: 0.8)
    results = {
        "bytes": 8e9,
        "seconds": {
            "cores": {"1": [4.0], "2": [4.0]},
            "network": {1: [16.0], 2: [8.0, 9.0]},
            "node_links": {1: [32.0], 2: [20.0]},
        },
    }
    s = summarize(results)
    assert s["cores"]["ratio"] == pytest.approx({1: 1.0, 2: 0.5})
    assert s["network"]["ratio"] == pytest.approx({1: 1.0, 2: 16 / 8.5 / 2})
    assert s["network"]["seconds"] == pytest.approx({1: 16.0, 2: 8.5})
    assert s["node_links"]["ratio"] == pytest.approx({1: 1.0, 2: 0.8})


def test_a_machine_without_the_tools_is_refused_in_one_line_with_exit_2(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no unshare, nsenter, ip or tc on it
    code = "from benchmarks.host_network import private_network; private_network()"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "simulated hosts need unshare, nsenter, ip, tc (util-linux, iproute2): install them"
    )
