"""Shared fixtures: a fresh platform registry per test, the tiny model made once per session (a
session-wide ROLL_DEVICE_HOME, so runs share the one the default `model.tiny_dir` names), and one
Ray cluster for the session's whole runs (`shared_cluster`); under pytest-xdist, the nodes of a
simulated cluster start with no other test running beside them (tests/run_alone.py), and the files
go to the workers longest first (tests/file_order.py).

Every Ray cluster a test starts is a throwaway one on this machine, so the whole session runs
without Ray's token authentication: Ray fixes a process's mode at its first local `ray.init`
(token, when RAY_AUTH_MODE is unset), and a simulated cluster (token-less) driven later from the
same process would then lose its actors. docs/cluster.md says the same for users. Each test
leaves the root logger as it found it, and each test file the process's environment and glibc
malloc's settings (`process_env_restored`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

import pytest

from roll_device.cluster.sim_nodes import AUTH_MODE_ENV, SimNodes
from roll_device.compat.host_malloc import apply_malloc_env
from roll_device.platforms import registry
from tests.file_order import FileSeconds, order_longest_first, recorded_seconds
from tests.isolated import ROOT, isolated_env
from tests.run_alone import alone, held_slot, shared_dir

os.environ[AUTH_MODE_ENV] = "disabled"


def pytest_addoption(parser):
    parser.addoption(
        "--write-file-seconds",
        action="store_true",
        help="write each test file's seconds into tests/file_seconds.json (the order xdist hands files out)",
    )


def pytest_configure(config):
    if config.getoption("write_file_seconds") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileSeconds(), "file-seconds")


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # xdist's workers collect; the controller hands files out
        order_longest_first(items, recorded_seconds())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with held_slot(shared_dir(item.config)):
        yield


@pytest.fixture(scope="session", autouse=True)
def sim_nodes_start_alone():
    """A simulated cluster's worker nodes start with no other test running (tests/run_alone.py)."""
    add_nodes = SimNodes.add_nodes

    def add_nodes_alone(nodes, entries, alive_nodes):
        with alone() if entries else contextlib.nullcontext():
            return add_nodes(nodes, entries, alive_nodes)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SimNodes, "add_nodes", add_nodes_alone)
        yield


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """ROLL_DEVICE_HOME for the session: what runs make on first use (the tiny model) is made once,
    and nothing is written into the user's ~/.cache."""
    home = tmp_path_factory.mktemp("roll-device-home")
    before = os.environ.get("ROLL_DEVICE_HOME")
    os.environ["ROLL_DEVICE_HOME"] = str(home)
    yield home
    if before is None:
        del os.environ["ROLL_DEVICE_HOME"]
    else:
        os.environ["ROLL_DEVICE_HOME"] = before


# glibc malloc's own settings (mallopt(3)), for the variables host_malloc.py applies
GLIBC_MALLOC_DEFAULTS = {
    "MALLOC_TRIM_THRESHOLD_": str(128 << 10),
    "MALLOC_TOP_PAD_": str(128 << 10),
    "MALLOC_MMAP_MAX_": "65536",
}


@pytest.fixture(scope="module", autouse=True)
def process_env_restored():
    """The process's environment as it was before the test file, and glibc malloc's settings back
    to its own where the file changed them: an engine started in this process (vLLM on the CPU)
    writes its variables into `os.environ` and applies malloc's with mallopt, and every later file
    on the same xdist worker, and every process it starts, would inherit them."""
    before = dict(os.environ)
    yield
    changed_malloc = {k for k in GLIBC_MALLOC_DEFAULTS if os.environ.get(k) != before.get(k)}
    for name in set(os.environ) - set(before):
        del os.environ[name]
    os.environ.update(before)
    if changed_malloc:
        apply_malloc_env({k: before.get(k, GLIBC_MALLOC_DEFAULTS[k]) for k in changed_malloc})


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv("ROLL_DEVICE", raising=False)
    registry.reset_for_tests()
    yield
    registry.reset_for_tests()


@pytest.fixture(autouse=True)
def root_logging_restored():
    """The root logger as it was before the test: a command run in-process with a Hydra flag is
    Hydra's app, which points the root logger at the sys.stdout of that moment (a test's capture,
    closed after it), so a later test's log line would print a logging error."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session")
def tiny_model_path(session_home):
    """The tiny model at the default `model.tiny_dir` of the session: the one runs use, made once."""
    from roll_device.models.tiny import make_tiny_model

    return str(make_tiny_model(session_home / "tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_moe_path(session_home):
    """The tiny Qwen3-MoE (8 experts, top-2) at the folder experiment=moe makes it in, made once."""
    from roll_device.models.tiny import make_tiny_model

    return str(make_tiny_model(session_home / "tiny-qwen3-moe", architecture="qwen3_moe"))


@pytest.fixture(scope="session")
def shared_cluster():
    """The overrides that run a whole run on the session's one local Ray cluster
    (tests/ray_head.py), joined as an existing cluster (`cluster=remote`): each run is a Ray job
    of its own, and no run pays for Ray's start. Runs that test the embedded cluster itself, or
    need a cluster of other resources, start their own."""
    head = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_head"],
        cwd=ROOT,
        env=isolated_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    address = head.stdout.readline().strip()
    if not address:
        head.wait(timeout=60)
        pytest.fail(f"the session's Ray cluster did not start (exit {head.returncode}); its output is above")
    yield ("cluster=remote", f"cluster.address={address}")
    head.stdin.close()
    head.wait(timeout=120)
