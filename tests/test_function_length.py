"""No function or method in roll_device/ or strategies/ is over 60 lines (from its `def` to its
last line, its docstring included): a longer one is split into named parts."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("roll_device", "strategies")
MAX_LINES = 60


def long_functions(root: Path, packages=PACKAGES, limit: int = MAX_LINES) -> list[str]:
    """`path:line name (N lines)` for each function in `packages` under `root` over `limit` lines."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > limit:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_60_lines():
    found = long_functions(ROOT)
    assert found == [], f"over {MAX_LINES} lines, split into named parts: " + "; ".join(found)


def test_the_check_counts_every_line_of_a_function_and_of_a_nested_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    nested = "def outer():\n    def inner():\n" + "".join(f"        y{i} = {i}\n" for i in range(60))
    (tmp_path / "pkg" / "m.py").write_text(
        f"def fits():\n{body}\n\nasync def over():\n{body}    x59 = 59\n\n{nested}"
    )
    assert long_functions(tmp_path, ("pkg",)) == [
        "pkg/m.py:63 over (61 lines)",
        "pkg/m.py:125 outer (62 lines)",
        "pkg/m.py:126 inner (61 lines)",
    ]
