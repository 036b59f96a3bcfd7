"""The suite's own file order (tests/file_order.py): longest recorded file first, unlisted files
before all, a file's tests in their order; a recording run adds up each file's durations and keeps
the entries of files that still exist."""

import json
from types import SimpleNamespace

from tests import file_order


def item(path: str, name: str):
    return SimpleNamespace(location=(path, 0, name), name=name)


def test_files_go_longest_first_and_unlisted_ones_before_all():
    items = [
        item("tests/a.py", "a1"),
        item("tests/b.py", "b1"),
        item("tests/a.py", "a2"),
        item("tests/new.py", "n1"),
        item("tests/c.py", "c1"),
        item("tests/b.py", "b2"),
    ]
    file_order.order_longest_first(items, {"tests/a.py": 3.0, "tests/b.py": 40.0, "tests/c.py": 12.5})
    assert [i.name for i in items] == ["n1", "b1", "b2", "c1", "a1", "a2"]


def test_a_recording_adds_each_files_durations_and_keeps_the_files_that_still_exist(tmp_path, monkeypatch):
    (tmp_path / "tests").mkdir()
    for name in ("kept.py", "ran.py"):
        (tmp_path / "tests" / name).write_text("")
    seconds_file = tmp_path / "file_seconds.json"
    seconds_file.write_text(json.dumps({"tests/kept.py": 5.0, "tests/ran.py": 99.0, "tests/gone.py": 7.0}))
    monkeypatch.setattr(file_order, "SECONDS_FILE", seconds_file)

    recorder = file_order.FileSeconds()
    for duration in (0.25, 10.0, 0.5):  # set-up, call, teardown
        recorder.pytest_runtest_logreport(
            SimpleNamespace(location=("tests/ran.py", 1, "t"), duration=duration)
        )
    recorder.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace(rootpath=tmp_path)))

    written = json.loads(seconds_file.read_text())
    assert written == {"tests/ran.py": 10.8, "tests/kept.py": 5.0}
    assert list(written) == ["tests/ran.py", "tests/kept.py"]
