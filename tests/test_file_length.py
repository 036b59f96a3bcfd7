"""No source file over 500 lines (issue 44): a file that long holds more than one job, and is
split into modules with a job each. Tests are left out; the product code, the strategies, the
benchmarks and the scripts are held to it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("roll_device", "strategies", "benchmarks", "scripts")
MOST_LINES = 500


def long_files(root: Path = ROOT, most: int = MOST_LINES) -> list[str]:
    """`path: lines` for each Python file under the scanned folders over `most` lines."""
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > most:
                found.append(f"{path.relative_to(root).as_posix()}: {lines}")
    return found


def test_no_source_file_is_over_500_lines():
    assert long_files() == [], f"split these into modules with one job each (at most {MOST_LINES} lines)"


def test_the_rule_catches_a_long_file(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "long.py").write_text("x = 1\n" * 501)
    (tmp_path / "benchmarks" / "short.py").write_text("x = 1\n" * 500)
    assert long_files(tmp_path) == ["benchmarks/long.py: 501"]
