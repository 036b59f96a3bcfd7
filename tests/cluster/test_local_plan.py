"""`roll-device plan` on the default cluster (an embedded Ray instance of this machine), run as a
user runs it: the device map of the default config, and a plan that does not fit (exit 2)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def plan(*overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "roll_device.cli", "plan", *overrides],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_plan_on_this_machine_and_a_plan_that_does_not_fit():
    fits, too_big = plan("cluster.num_cpus=2"), plan("cluster.num_cpus=2", "roles.actor_infer.num_devices=20")
    out, err = fits.communicate(timeout=300)
    assert fits.returncode == 0, err
    assert "cluster 'local'" in out
    table = [line.split() for line in out.split("device plan:")[1].strip().splitlines()]
    assert {row[0]: row[1:3] for row in table[1:]} == {  # no accelerator here: `auto` is the CPU
        "actor_infer": ["cpu", "1"],
        "actor_train": ["cpu", "1"],
        "reference": ["cpu", "1"],
        "reward": ["cpu", "1"],
    }
    assert [row[6] for row in table[1:] if row[0] == "reference"] == ["actor_train"]

    out, err = too_big.communicate(timeout=300)
    assert too_big.returncode == 2
    assert (
        "roll-device plan: error: role 'actor_infer' wants 20 cpu device(s), but only 8 of the cluster's 8 "
        "(0.25 CPU per worker slot) are available"
    ) in err
