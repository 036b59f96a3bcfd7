"""scripts/config_reach.py's count: the modules a run's configuration reaches, the edges between
them, and the modules entered from more than one other module."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from config_reach import reach  # scripts/ is no package: imported from its folder


def test_reach_counts_each_module_once_and_names_a_module_entered_from_two():
    calls = [
        ("pkg.run", "run_checked", "__main__"),
        ("pkg.gate", "check", "pkg.run"),
        ("pkg.plan", "build", "pkg.run"),
        ("pkg.gate", "check_more", "pkg.run"),
        ("pkg.experiment", "run", "pkg.run"),
        ("pkg.plan", "build", "pkg.experiment"),
        ("pkg.experiment", "_run", "pkg.experiment"),
    ]
    found = reach(calls)
    assert found["modules"] == ["pkg.run", "pkg.gate", "pkg.plan", "pkg.experiment"]
    assert found["edges"] == [
        ("__main__", "pkg.run"),
        ("pkg.run", "pkg.gate"),
        ("pkg.run", "pkg.plan"),
        ("pkg.run", "pkg.experiment"),
        ("pkg.experiment", "pkg.plan"),
    ]
    assert found["entered_twice"] == {"pkg.plan": ["pkg.experiment", "pkg.run"]}


def test_a_tree_enters_no_module_twice():
    calls = [("a", "f", "__main__"), ("b", "g", "a"), ("c", "h", "b"), ("b", "g2", "a")]
    assert reach(calls)["entered_twice"] == {}
