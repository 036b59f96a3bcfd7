"""The embedded Ray instance ends with its driver: after a driver killed outright (SIGKILL), none of
the processes `ray.init` started outlives it by more than a few seconds (Ray 2.60 alone leaves its
dashboard and runtime-env agents for about a minute); a clean shutdown ends the watcher too."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from roll_device.cluster import reaper

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import json, sys
from roll_device.cluster import start_cluster
from roll_device.cluster.reaper import descendants
from tests.configs import cluster_settings

before = descendants()
handle = start_cluster(cluster_settings("cluster.num_cpus=1"))
watcher = handle.watcher.process.pid
print(json.dumps({"ray": sorted(descendants() - before), "watcher": watcher}), flush=True)
sys.stdin.read()
"""


def alive(named: list[tuple[int, float]]) -> list[str]:
    names = []
    for pid, started in named:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                names.append(process.name())
        except psutil.NoSuchProcess:
            continue
    return names


def test_ray_processes_end_within_seconds_of_a_killed_driver():
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        started = json.loads(driver.stdout.readline())
        named = [tuple(entry) for entry in started["ray"]]
        assert {"raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(alive(named))
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 15  # Ray alone: about 60 s
        while alive(named) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive(named) == []
        assert not psutil.pid_exists(started["watcher"]) or psutil.Process(started["watcher"]).status() == (
            psutil.STATUS_ZOMBIE
        )
    finally:
        driver.kill()


def test_the_watcher_spares_processes_it_was_not_given_and_pids_reused():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        target_started = psutil.Process(target.pid).create_time()
        reused = (bystander.pid, psutil.Process(bystander.pid).create_time() + 1.0)  # another process
        watcher = reaper.watch({(target.pid, target_started), reused})
        time.sleep(0.5)
        assert target.poll() is None  # nothing happens while this process runs
        watcher.release()
        assert target.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        bystander.kill()
        target.kill()
