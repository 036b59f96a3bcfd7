"""Fitness rules of the structure (issue 26): configuration is read in one idiom and remote calls
name worker methods as objects. Each rule scans the source and fails on the first new exception:
- omegaconf (the composed DictConfig) is read only in roll_device/commands/, which composes the
  config and reads it once into the typed `RunConfig`;
- every `*Settings` / `*Options` class is a `Section` (pydantic, frozen, unknown keys refused),
  and no module re-reads configuration through a TypeAdapter or a `from_config`;
- no dispatch (`call_all`, `call_rank0`, their async twins, `scatter_gather`, vLLM's
  `collective_rpc`) names its method as a string.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("roll_device", "strategies", "benchmarks", "scripts")
CONFIG_READERS = ("roll_device/commands/",)
SECTION_BASES = {"Section", "OpenSection"}
DISPATCH = {
    "call_all",
    "async_call_all",
    "call_rank0",
    "async_call_rank0",
    "scatter_gather",
    "async_scatter",
    "collective_rpc",
}


def sources(root: Path = ROOT) -> dict[str, ast.Module]:
    found = {}
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            found[path.relative_to(root).as_posix()] = ast.parse(path.read_text())
    return found


def omegaconf_readers(modules: dict[str, ast.Module]) -> list[str]:
    found = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            module = (
                node.module
                if isinstance(node, ast.ImportFrom)
                else next((a.name for a in node.names), "")
                if isinstance(node, ast.Import)
                else None
            )
            if module and module.split(".")[0] == "omegaconf" and not name.startswith(CONFIG_READERS):
                found.append(f"{name}:{node.lineno}")
    return found


def _base_name(base: ast.expr) -> str:
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")


def other_config_idioms(modules: dict[str, ast.Module]) -> list[str]:
    """Settings/Options classes outside the Section family, TypeAdapters and `from_config`s."""
    classes = {
        node.name: [_base_name(b) for b in node.bases]
        for tree in modules.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }

    def is_section(name: str, seen: frozenset = frozenset()) -> bool:
        if name in SECTION_BASES:
            return True
        return name not in seen and any(is_section(b, seen | {name}) for b in classes.get(name, []))

    found = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Settings", "Options")):
                if not is_section(node.name):
                    found.append(f"{name}:{node.lineno} class {node.name} is not a Section")
            elif isinstance(node, ast.FunctionDef) and node.name == "from_config":
                found.append(f"{name}:{node.lineno} def from_config")
            elif isinstance(node, ast.Name) and node.id == "TypeAdapter":
                found.append(f"{name}:{node.lineno} TypeAdapter")
    return found


def string_named_calls(modules: dict[str, ast.Module]) -> list[str]:
    found = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in DISPATCH
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.append(f"{name}:{node.lineno} {node.func.attr}({node.args[0].value!r})")
    return found


def test_configuration_is_read_in_one_idiom():
    modules = sources()
    assert omegaconf_readers(modules) == [], "read the typed RunConfig (roll_device/pipeline/config.py)"
    assert other_config_idioms(modules) == [], "a config section is a roll_device.settings.Section"


def test_remote_calls_name_worker_methods_as_objects():
    assert string_named_calls(sources()) == [], "pass the worker method itself (Worker.method)"


@pytest.mark.parametrize(
    "code, rule",
    [
        ("from omegaconf import DictConfig\n", omegaconf_readers),
        ("import omegaconf.errors\n", omegaconf_readers),
        ("@dataclass\nclass CacheSettings:\n    size: int\n", other_config_idioms),
        (
            "class A(Section): ...\nclass B(A): ...\nclass LoopOptions(B, Other): ...\nx = TypeAdapter(int)\n",
            other_config_idioms,
        ),
        ("def from_config(cfg): ...\n", other_config_idioms),
        ("group.call_all('setup', 1)\n", string_named_calls),
        ("llm.collective_rpc('load_weights')\n", string_named_calls),
    ],
)
def test_each_rule_catches_its_case(tmp_path, code, rule):
    (tmp_path / "roll_device" / "pipeline").mkdir(parents=True)
    (tmp_path / "roll_device" / "pipeline" / "leak.py").write_text(code)
    assert len(rule(sources(tmp_path))) == 1
