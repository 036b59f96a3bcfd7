"""Quiet output: a worker's descriptors 1 and 2 go to its log file, and the summary leaves known
start-up noise out."""

import subprocess
import sys

from roll_device.pipeline.output import append_report, summarise_worker_logs, warnings_worth_reading

CAPTURE = """
import os, sys
from roll_device.pipeline.output import capture_output
print("before")
capture_output(sys.argv[1])
print("to stdout"); print("to stderr", file=sys.stderr); sys.stdout.flush()
os.system("echo from a child process")
"""


def test_capture_sends_stdout_stderr_and_children_to_the_file(tmp_path):
    log = tmp_path / "logs" / "actor_infer_0.log"
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE, str(log)], capture_output=True, text=True, check=True
    )
    assert done.stdout == "before\n" and done.stderr == ""
    assert sorted(log.read_text().splitlines()) == ["from a child process", "to stderr", "to stdout"]


def test_the_summary_names_warnings_that_matter_once(tmp_path):
    (tmp_path / "actor_infer_0.log").write_text(
        "Triton is installed, but doesn't include CPU backend. Disabling Triton.\n"
        "x.py:1: FutureWarning: `torch.distributed.reduce_op` is deprecated\n"
        "Loading weights: 100%|##########| 27/27\n"
        "UserWarning: KV cache smaller than the batch\n"
    )
    (tmp_path / "reward_0.log").write_text("UserWarning: KV cache smaller than the batch\n")
    assert warnings_worth_reading(tmp_path) == ["actor_infer_0: UserWarning: KV cache smaller than the batch"]
    assert summarise_worker_logs(tmp_path) == (
        f"worker logs: {tmp_path} (1 warning line(s) worth reading):\n"
        "  actor_infer_0: UserWarning: KV cache smaller than the batch"
    )
    (tmp_path / "actor_infer_0.log").write_text("NUMA binding: Using MEMBIND policy\n")
    (tmp_path / "reward_0.log").write_text("")
    assert summarise_worker_logs(tmp_path).endswith("(no warnings beyond known start-up notices)")


def test_the_log_of_a_worker_whose_end_the_error_told_is_left_out_of_the_summary(tmp_path):
    """Ray's report of a dead worker, appended to its log (the run's error told its end already):
    that log's lines, vLLM's account of a dead rank among them, are not summarised again."""
    log = tmp_path / "actor_infer_0.log"
    log.write_text("ERROR [multiproc_executor.py:315] Worker proc VllmWorker-1 died unexpectedly\n")
    (tmp_path / "reward_0.log").write_text("UserWarning: a reward of None\n")
    append_report(log, "this worker died; Ray's report:", "The actor died.\nWorker exit type: SYSTEM_ERROR")
    assert log.read_text().splitlines()[1:] == [
        "[roll-device] this worker died; Ray's report:",
        "[roll-device] The actor died.",
        "[roll-device] Worker exit type: SYSTEM_ERROR",
    ]
    assert warnings_worth_reading(tmp_path) == ["reward_0: UserWarning: a reward of None"]
