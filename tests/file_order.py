"""The order in which pytest-xdist hands test files to its workers: longest first.

Under `--dist loadfile` each worker takes the next file of the queue when it runs low, so the
suite ends when the last file started ends. pytest-xdist orders the queue by the number of tests
in a file, which puts the files of one long whole run (a fault run, the main job, a submission)
last, where one of them keeps a worker busy for minutes after the other has run out. Ordered by
their measured seconds instead (longest processing time first), the long files start early and
the short ones fill in at the end. pyproject.toml turns xdist's own order off
(`--no-loadscope-reorder`) so that it keeps this one.

The seconds per file are in tests/file_seconds.json, measured by a run of the suite on a 2-core
machine with `--write-file-seconds` (it adds the setup, call and teardown times of each file's
tests, and keeps the files that did not run). They only order the queue: a stale or missing entry
costs time, never a result; a file not listed yet goes first, as if it were long.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).resolve().parent / "file_seconds.json"


def recorded_seconds() -> dict[str, float]:
    if not SECONDS_FILE.exists():
        return {}
    return json.loads(SECONDS_FILE.read_text())


def order_longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Reorder `items` in place: files by recorded seconds, longest first (unlisted files first);
    the sort is stable, so the tests of a file keep their order and files of equal seconds theirs."""
    longest = max(seconds.values(), default=0.0) + 1.0
    items.sort(key=lambda item: -seconds.get(item.location[0], longest))


class FileSeconds:
    """Adds up each file's test durations as the reports arrive (on xdist's controller, every
    worker's), and writes them into tests/file_seconds.json at the end of the session."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.location[0]] += report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        root = Path(session.config.rootpath)
        kept = {name: value for name, value in recorded_seconds().items() if (root / name).exists()}
        kept.update({name: round(value, 1) for name, value in self.seconds.items()})
        ordered = dict(sorted(kept.items(), key=lambda entry: -entry[1]))
        SECONDS_FILE.write_text(json.dumps(ordered, indent=1) + "\n")
