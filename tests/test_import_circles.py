"""No import circles in the cluster layer, the strategies, the pipeline, the doctor, the graph
runners, the models, the inputs or the commands: every import there, at module top or inside a
function, points one way (plan -> placement never; the strategy packages -> base, and
strategies/registry.py -> both; pipeline/roles.py -> run_plan.py, never back). And nothing
points back up the floors: platforms and sim at the bottom, then the capabilities (comm, cluster,
graph, models, inputs, tracking, agentic, compat), the strategies, the doctor, the pipeline, the commands, the CLI.
The package's own `roll_device/__init__.py` (the public names) stands outside the floors."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = (
    "roll_device.agentic",
    "roll_device.cluster",
    "roll_device.commands",
    "roll_device.compat",
    "roll_device.doctor",
    "roll_device.graph",
    "roll_device.inputs",
    "roll_device.models",
    "roll_device.pipeline",
    "roll_device.tracking",
    "strategies",
)


FLOORS = (
    (
        "roll_device.errors",
        "roll_device.packages",
        "roll_device.settings",
        "roll_device.files",
        "roll_device.naming",
    ),
    ("roll_device.sim", "roll_device.platforms"),
    ("roll_device.compat", "roll_device.comm", "roll_device.cluster", "roll_device.graph"),
    ("roll_device.models", "roll_device.inputs", "roll_device.tracking", "roll_device.agentic"),
    ("strategies",),
    ("roll_device.doctor",),
    ("roll_device.pipeline",),
    ("roll_device.commands",),
    ("roll_device.cli",),
)


def floor(module: str) -> int | None:
    for number, packages in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return number
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for each import of a module on a higher floor than its importer's."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            below, above = floor(module), floor(target)
            if below is not None and above is not None and above > below:
                found.append(f"{module} -> {target}")
    return found


def module_names(root: Path) -> dict[str, Path]:
    found = {}
    for top in ("roll_device", "strategies"):
        for path in (root / top).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its text."""
    modules = module_names(root)
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circles_in_the_checked_packages():
    found = [group for group in circles(imports(ROOT)) if any(m.startswith(CHECKED) for m in group)]
    assert found == [], "import circles: " + "; ".join(" <-> ".join(group) for group in found)


def test_the_check_finds_a_circle(tmp_path):
    (tmp_path / "roll_device" / "cluster").mkdir(parents=True)
    (tmp_path / "strategies").mkdir()
    (tmp_path / "roll_device" / "cluster" / "plan.py").write_text(
        "def reserve():\n    from roll_device.cluster.placement import reserve\n"
    )
    (tmp_path / "roll_device" / "cluster" / "placement.py").write_text(
        "from roll_device.cluster.plan import Plan\n"
    )
    assert circles(imports(tmp_path)) == [["roll_device.cluster.placement", "roll_device.cluster.plan"]]


def test_nothing_points_back_up():
    assert upward_imports(imports(ROOT)) == [], "a lower floor imports a higher one"


def test_the_check_finds_an_upward_import(tmp_path):
    (tmp_path / "roll_device" / "platforms").mkdir(parents=True)
    (tmp_path / "roll_device" / "pipeline").mkdir(parents=True)
    (tmp_path / "strategies").mkdir()
    (tmp_path / "roll_device" / "pipeline" / "loop.py").write_text("X = 1\n")
    (tmp_path / "roll_device" / "platforms" / "cpu.py").write_text(
        "def f():\n    from roll_device.pipeline.loop import X\n"
    )
    assert upward_imports(imports(tmp_path)) == ["roll_device.platforms.cpu -> roll_device.pipeline.loop"]
