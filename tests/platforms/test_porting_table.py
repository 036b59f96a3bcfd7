"""docs/porting.md: every member its mapping table names exists on every platform class, and its
worked example runs on the CPU and on the simulated NPU (simulated results)."""

import math
import re

import pytest

from roll_device.platforms.cpu import CpuPlatform
from roll_device.platforms.cuda import CudaPlatform
from roll_device.platforms.npu import NpuPlatform
from roll_device.platforms.rocm import RocmPlatform
from tests.isolated import run_isolated
from tests.platforms.porting_checks import PORTING

CLASSES = [CudaPlatform, RocmPlatform, NpuPlatform, CpuPlatform]


def table_members() -> list[str]:
    table = (
        PORTING.read_text().split("<!-- device-needs:begin -->", 1)[1].split("<!-- device-needs:end -->")[0]
    )
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ") and "`" in line]
    return [m for row in rows for m in re.findall(r"`([\w.]+)`", row[2])]


def test_the_table_names_the_members_it_measured():
    members = table_members()
    assert len(set(members)) >= 60, "several needs may share a member; each need names its own"
    assert {
        "profiling.range_push",
        "facts.device_uuid",
        "collective_env",
        "env.collective_debug_env",
        "runtime.device_communicator",
        "memory.register_host_memory",
        "kernels.set_dnn_library_enabled",
        "ray_device_ids",
        "determinism.set_deterministic",
    } <= set(members)


def has_member(cls: type, member: str) -> bool:
    """`member` on the platform class, or `group.member` in the group class it names."""
    group, _, name = member.rpartition(".")
    return hasattr(getattr(cls, group) if group else cls, name)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.kind)
def test_every_member_in_the_table_exists_on_every_platform_class(cls):
    missing = [m for m in table_members() if not has_member(cls, m)]
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_worked_example_runs_on_the_cpu():
    r = run_isolated("tests.platforms.porting_checks:run_example")
    assert r["platform"] == "cpu" and math.isfinite(r["loss"]) and r["env"] == {}


def test_worked_example_runs_on_the_simulated_npu():
    r = run_isolated("tests.platforms.porting_checks:run_example", env={"ROLL_DEVICE": "npu-sim"})
    assert r["platform"] == "npu (simulated)" and math.isfinite(r["loss"])
    assert r["printed"].startswith("Ascend910B2 (simulated) ")
    assert r["env"] == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "HCCL_CONNECT_TIMEOUT": "1800",
        "HCCL_EXEC_TIMEOUT": "1800",
    }
