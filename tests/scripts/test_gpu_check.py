"""scripts/gpu-check.sh on a machine without a GPU (CI), and its per-test summary lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from junit_summary import lines  # scripts/ is no package: imported from its folder


def run_script(name: str, out_dir) -> subprocess.CompletedProcess:
    """`scripts/<name> <out_dir>` with a bare PATH and this interpreter as PYTHON."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / name), str(out_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would run")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    proc = run_script("gpu-check.sh", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu-check: skipped: no CUDA device visible to")
    assert (tmp_path / "summary.txt").read_text() == proc.stdout


def test_summary_has_one_line_per_test_case(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a.test_x" name="test_ok" time="1.25"/>'
        '<testcase classname="tests.a.test_x" name="test_bad" time="0.5">'
        '<failure message="AssertionError: 3 &lt; 2&#10;more">trace</failure></testcase>'
        '<testcase classname="tests.b.test_y" name="test_gpu[cuda]" time="0">'
        '<skipped message="needs a CUDA or ROCm GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert lines(str(report)) == [
        "check tests/a/test_x.py::test_ok: passed (1.2s)",
        "check tests/a/test_x.py::test_bad: FAILED (AssertionError: 3 < 2)",
        "check tests/b/test_y.py::test_gpu[cuda]: skipped (needs a CUDA or ROCm GPU)",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would run")
def test_the_gpu_job_without_a_gpu_says_so_and_exits_0(tmp_path):
    proc = run_script("gpu-job.sh", tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("gpu-job: skipped: no CUDA device"), proc.stderr
