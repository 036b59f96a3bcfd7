"""A new device kind is a plugin: with no change to roll-device, a platform installed by entry point
(tests/platforms/plugin_kind/rd_testaccel.py: kind `testaccel`, Ray resource `TESTACCEL`) gets
roles planned on it, and a GRPO run trains (FSDP2) and rolls out (HF strategy) on it, on a local
Ray cluster whose node declares that resource.

The plugin is installed the way pip would leave it, but into a temporary directory on PYTHONPATH
of the roll-device processes (the shared environment stays untouched): the module and a
dist-info with `entry_points.txt`, which importlib.metadata reads.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from roll_device.cluster.inventory import inventory_from_nodes
from roll_device.cluster.plan import build_plan, compute_kind
from roll_device.errors import ConfigError, PlanError
from roll_device.platforms import registry
from strategies.inference.hf import HfStrategy
from strategies.registry import strategy_class
from strategies.training.fsdp import FsdpTrainStrategy
from tests.cluster.test_plan import CPU_PER_WORKER, roles

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCE = Path(__file__).with_name("plugin_kind") / "rd_testaccel.py"
ON_THE_PLUGIN_KIND = [
    "cluster.resources={TESTACCEL:2}",
    "cluster.num_cpus=2",
    "roles.actor_train.device=testaccel",
    "roles.actor_infer.device=auto",  # the accelerator kind the cluster has most of: the plugin's
    "rollout=hf",
    "trainer=fsdp",
    "algorithm.kl_coef=0",
]


def install_plugin(target: Path) -> Path:
    """The plugin as an installed distribution under `target`; returns `target`."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(PLUGIN_SOURCE, target / "rd_testaccel.py")
    dist = target / "rd_testaccel-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rd-testaccel\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[roll_device.platforms]\ntestaccel = rd_testaccel:TestAccelPlatform\n"
    )
    return target


def roll_device(tmp_path: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """`roll-device <args>` with the plugin installed, in a fresh process."""
    site = install_plugin(tmp_path / "site")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(ROOT), os.environ.get("PYTHONPATH")])),
        "ROLL_DEVICE_HOME": str(tmp_path / "home"),
        "RD_TESTACCEL_LOG": str(tmp_path / "bound.log"),
    }
    env.pop("ROLL_DEVICE", None)
    command = [sys.executable, "-m", "roll_device.cli", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_plan_places_roles_on_the_plugin_kind(tmp_path):
    proc = roll_device(tmp_path, "plan", *ON_THE_PLUGIN_KIND, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = proc.stdout.split("device plan:")[1].splitlines()
    rows = {line.split()[0]: line.split() for line in plan if line.strip() and not line.startswith("role")}
    assert rows["actor_train"][1:3] == ["testaccel", "1"]
    assert rows["actor_infer"][1:3] == ["testaccel", "1"], "auto picked the plugin's kind"
    assert rows["reward"][1] == "cpu"
    assert "testaccel x2" in proc.stdout, "the node's TESTACCEL resource counts as testaccel devices"


@pytest.fixture
def plugin_installed(tmp_path, monkeypatch):
    """The plugin installed for this process (the registry forgets it after the test)."""
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site")))
    registry.reset_for_tests()


def node(**resources):
    return {"Alive": True, "NodeID": "n1", "NodeName": "n1", "Resources": {"CPU": 2.0, **resources}}


ROLES = {"actor_train": ("testaccel", 1), "actor_infer": ("auto", 1), "reward": ("cpu", 1)}


def test_the_plugin_kind_is_counted_planned_and_served(plugin_installed):
    plan = build_plan(roles(**ROLES), inventory_from_nodes([node(TESTACCEL=2.0)]), CPU_PER_WORKER)
    assert {role: p.kind for role, p in plan.roles.items()} == {
        "actor_train": "testaccel",
        "actor_infer": "testaccel",
        "reward": "cpu",
    }
    assert strategy_class("train", "fsdp", "testaccel") is FsdpTrainStrategy
    assert strategy_class("inference", "hf", "testaccel") is HfStrategy
    assert compute_kind("testaccel", simulated=True) == "cpu", "no simulation of its own: the host"


def test_the_plugin_kind_fills_the_platform_s_groups(plugin_installed):
    accel = registry.get_platform("testaccel")
    assert accel.facts.device_arch() == "testaccel-1", "its own group class"
    assert accel.topology.cpu_affinity() == sorted(os.sched_getaffinity(0)), "the CPU's, inherited"
    with pytest.raises(NotImplementedError, match="platform 'testaccel' does not support facts.device_uuid"):
        accel.facts.device_uuid()


def test_the_plugin_kind_that_does_not_fit_is_named(plugin_installed):
    wider = roles(**{**ROLES, "actor_train": ("testaccel", 2)})
    with pytest.raises(PlanError) as err:
        build_plan(wider, inventory_from_nodes([node(TESTACCEL=2.0)]), CPU_PER_WORKER)
    assert str(err.value).startswith(
        "role 'actor_infer' wants 1 testaccel device(s), but only 0 of the cluster's 2 are available "
        "after 2 for actor_train planned for other roles (cluster: n1: 2 CPU, 2 testaccel)"
    )


def test_a_strategy_the_plugin_kind_cannot_host_says_where_it_runs(plugin_installed):
    with pytest.raises(ConfigError) as err:
        strategy_class("inference", "vllm", "testaccel")
    assert str(err.value) == (
        "inference strategy 'vllm' does not run on device kind 'testaccel': it supports npu, cuda, rocm, cpu"
    )


@pytest.mark.slow
def test_two_steps_train_and_roll_out_on_the_plugin_kind(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*ON_THE_PLUGIN_KIND, "max_steps=2", "save_every=0", f"hydra.run.dir={run_dir}"]
    proc = roll_device(tmp_path, "run", *overrides, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["weights_version"] for r in records] == [1, 2], "the rollout got each step's weights"
    bound = (tmp_path / "bound.log").read_text().splitlines()
    assert len({line.split()[0] for line in bound}) == 2, "a trainer and a rollout worker bound testaccel"
    assert {tuple(line.split()[1:]) for line in bound} == {("testaccel", "0")}
