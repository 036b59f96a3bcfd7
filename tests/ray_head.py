"""One Ray cluster for a test session's whole runs, in a process of its own.

`python -m tests.ray_head [overrides]` starts embedded Ray the way a run does (`start_cluster` on the
shipped `cluster=local` section, or the cluster the overrides of the `cluster` group describe, with
the reaper that stops Ray's helper processes), prints the cluster's GCS address as its first line
and its dashboard's address (or None) as its second, and keeps the cluster until its standard
input closes. Each run of
the session joins it as a driver of its own (`cluster=remote cluster.address=...`): a run's actors
and placement groups end with its Ray job, as on any long-lived cluster, and the session pays for
Ray's start (several seconds on two cores) once instead of once per run.
"""

from __future__ import annotations

import sys

from roll_device.cluster.launcher import start_cluster
from tests.configs import cluster_settings


def main() -> None:
    with start_cluster(cluster_settings(*sys.argv[1:])) as cluster:
        print(cluster.address, cluster.dashboard_url, sep="\n", flush=True)
        sys.stdin.read()  # until the test session closes the pipe (or dies)


if __name__ == "__main__":
    main()
