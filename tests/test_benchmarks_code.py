"""Benchmarks are product code (issue 44): no benchmark imports tests/ or scripts/ (a test may
import a benchmark's helpers, never the other way), and benchmarks/ holds code only: what the
benchmarks measured lives outside it (results/), their sections in docs/benchmarks.md."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("tests", "scripts")


def imported_modules(tree: ast.Module) -> list[str]:
    """Every module a file imports, at module top or inside a function."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def forbidden_imports(folder: Path, root: Path = ROOT) -> list[str]:
    """`file: module` for each import of tests/ or scripts/ in `folder`'s Python files; scripts/ is
    no package, so a module named as one of its files counts too (imported from its folder)."""
    scripts = {path.stem for path in (root / "scripts").glob("*.py")}
    found = []
    for path in sorted(folder.rglob("*.py")):
        for module in imported_modules(ast.parse(path.read_text())):
            top = module.split(".")[0]
            if top in FORBIDDEN or top in scripts:
                found.append(f"{path.relative_to(root).as_posix()}: {module}")
    return found


def non_code_files(folder: Path) -> list[str]:
    """Files under `folder` that are not Python source (bytecode caches left out)."""
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts
    )


def test_no_benchmark_imports_tests_or_scripts():
    assert forbidden_imports(ROOT / "benchmarks") == []


def test_benchmarks_holds_only_code():
    assert non_code_files(ROOT / "benchmarks") == [], "results go to results/, plots and sections to docs/"


def test_the_rules_catch_a_planted_import_and_a_results_file(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "job_tool.py").write_text("")
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "a.py").write_text("from tests.configs import run_config\n")
    (bench / "b.py").write_text("def f():\n    import scripts.tool\n    from job_tool import x\n")
    (bench / "c.py").write_text("from benchmarks.configs import run_config\nimport json\n")
    (bench / "results.json").write_text("{}")
    assert forbidden_imports(bench, tmp_path) == [
        "benchmarks/a.py: tests.configs",
        "benchmarks/b.py: scripts.tool",
        "benchmarks/b.py: job_tool",
    ]
    assert non_code_files(bench) == ["results.json"]
