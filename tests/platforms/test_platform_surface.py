"""The `Platform` surface a reader can hold: on the class, the identity and the members the project
itself calls; every other member (the porting helpers other frameworks need) inside a named group
(`platform.memory`, `platform.env`, ...; docs/platforms.md, "Groups").

How the members are counted: the public names of `dir(cls)` of each concrete platform class (no
leading underscore, so no dunders), a group attribute counting as one. A member counts as called
by the project when its name is an attribute read somewhere in the project's code (roll_device/,
strategies/, benchmarks/, scripts/; never tests/), outside the files that define the platform and
group classes. The check is by name: a name that some other object also has passes.
"""

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from roll_device.platforms.cpu import CpuPlatform
from roll_device.platforms.cuda import CudaPlatform
from roll_device.platforms.groups import PlatformGroup
from roll_device.platforms.npu import NpuPlatform
from roll_device.platforms.rocm import RocmPlatform

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("roll_device", "strategies", "benchmarks", "scripts")
MAX_FLAT = 93  # vLLM 0.32's Platform has 93 public members
# The identity: the contract names (ARCHITECTURE.md) and the class attributes that describe a kind
# (data a reader looks up, not helpers). A new one is added here on purpose, or goes into a group.
IDENTITY = {
    "kind",
    "device_type",
    "dispatch_key",
    "ray_resource",
    "visible_devices_env",
    "dist_backend",
    "ray_noset_visible_devices_env",
    "ray_accelerator_type_prefixes",
    "graph_class_name",
    "graph_budget",
    "compile_backend",
    "supports_ipc",
    "collectives_copy_whole",
    "allocator_conf_env",
    "collective_tuning_env",
    "collective_timeout_envs",
    "required_package",
    "torch_companion",
    "toolkit_name",
    "install_hint",
    "launch_blocking_env",
    "simulated_kind",
    "simulated_count_env",
    "torch_build",
}


def plugin_class() -> type:
    path = ROOT / "tests" / "platforms" / "plugin_kind" / "rd_testaccel.py"
    spec = importlib.util.spec_from_file_location("rd_testaccel_surface", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TestAccelPlatform


CLASSES = [CpuPlatform, CudaPlatform, RocmPlatform, NpuPlatform, plugin_class()]


def flat_members(cls: type) -> list[str]:
    return sorted(name for name in dir(cls) if not name.startswith("_"))


def groups(cls: type) -> set[str]:
    """The group attributes: read on the class, each is its group's class."""
    return {
        name
        for name in flat_members(cls)
        if isinstance(getattr(cls, name), type) and issubclass(getattr(cls, name), PlatformGroup)
    }


def defining_files() -> set[Path]:
    """The files that define the platform classes and their groups (their own calls do not count)."""
    classes = {c for cls in CLASSES for c in cls.__mro__}
    classes |= {c for cls in CLASSES for name in groups(cls) for c in getattr(cls, name).__mro__}
    return {
        Path(inspect.getsourcefile(c)).resolve() for c in classes if c.__module__.startswith("roll_device.")
    }


def project_attributes() -> set[str]:
    """Every attribute name read in the project's code: Python files through their syntax tree (so
    strings and comments do not count), shell scripts by their `.name` spellings."""
    skip, names = defining_files(), set()
    for folder in PROJECT:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix == ".py" and path.resolve() not in skip:
                tree = ast.parse(path.read_text())
                names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
            elif path.suffix == ".sh":
                names |= set(re.findall(r"\.([A-Za-z_]\w*)", path.read_text()))
    return names


def only_tests_call(cls: type, called: set[str]) -> list[str]:
    """Flat members that are neither identity, a group, nor called by the project."""
    return [m for m in flat_members(cls) if m not in IDENTITY | groups(cls) | called]


@pytest.fixture(scope="module")
def called() -> set[str]:
    return project_attributes()


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.kind)
def test_a_flat_member_is_identity_a_group_or_called_by_the_project(cls, called):
    stray = only_tests_call(cls, called)
    assert not stray, f"{cls.__name__}: {stray} are called by no project code: move them into a group"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.kind)
def test_the_flat_surface_is_no_larger_than_vllm_s(cls):
    assert len(flat_members(cls)) <= MAX_FLAT, f"{cls.__name__} has {len(flat_members(cls))} flat members"


def test_a_helper_added_flat_is_caught(called):
    class Grown(CpuPlatform):
        def porting_helper_only_tests_call(self) -> dict[str, str]:
            return {}

    assert only_tests_call(Grown, called) == ["porting_helper_only_tests_call"]


def test_every_kind_fills_the_same_groups():
    expected = {"env", "kernels", "memory", "profiling", "determinism", "facts", "topology", "runtime"}
    for cls in CLASSES:
        assert groups(cls) == expected, cls.__name__
        for name in expected:
            assert getattr(cls, name).attribute == name
