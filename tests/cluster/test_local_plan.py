"""`roll-device plan` on the default cluster (an embedded Ray instance of this machine), run as a
user runs it. (Plans that do not fit: test_sim_cluster.py in-process, test_submit.py through the
CLI inside a job.)"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_on_this_machine_prints_the_device_map():
    done = subprocess.run(
        [sys.executable, "-m", "roll_device.cli", "plan", "cluster.num_cpus=2"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "cluster 'local'" in done.stdout
    assert done.stdout.startswith("step plan: grpo, 8 prompts x 8 samples"), "the step plan comes first"
    table = [line.split() for line in done.stdout.split("device plan:")[1].strip().splitlines()]
    assert {row[0]: row[1:3] for row in table[1:]} == {  # no accelerator here: `auto` is the CPU
        "actor_infer": ["cpu", "1"],
        "actor_train": ["cpu", "1"],
        "reference": ["cpu", "1"],
        "reward": ["cpu", "1"],
    }
    assert [row[7] for row in table[1:] if row[0] == "reference"] == ["actor_train"]
