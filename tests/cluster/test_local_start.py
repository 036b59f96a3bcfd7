"""The embedded Ray node's start on a loaded machine: Ray gives its own node a fixed 30 s to
register and then raises a bare Exception; the launcher starts it again, and after its last try
ends in one line. Ray's start is replaced by one that times out the way Ray's does (a loaded
machine cannot be made on demand); everything else is the launcher's own code."""

import os
import signal
import sys

import pytest
import ray

from roll_device.cluster import launcher
from roll_device.cluster.launcher import ClusterStartError, start_cluster
from roll_device.pipeline.interrupts import RunTerminatedError, how_stopped, sigterm_as_interrupt
from tests.configs import cluster_settings

RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed "
    "to startup or the GCS has become overloaded."
)


def test_a_start_that_times_out_is_tried_again_then_refused_in_one_line(monkeypatch):
    tries = []

    def timing_out(**kwargs):
        tries.append(kwargs["address"])
        raise Exception(RAY_TIMEOUT)  # noqa: TRY002 - what Ray raises

    monkeypatch.setattr(ray, "init", timing_out)
    with pytest.raises(ClusterStartError) as failed:
        start_cluster(cluster_settings())
    assert tries == ["local"] * launcher.LOCAL_START_ATTEMPTS
    message = str(failed.value)
    assert "\n" not in message and f"did not start in {launcher.LOCAL_START_ATTEMPTS} tries" in message
    assert failed.value.exit_code == 1


def test_a_start_that_times_out_once_goes_on(monkeypatch):
    real_init, tries = ray.init, []

    def slow_once(**kwargs):
        tries.append(1)
        if len(tries) == 1:
            raise Exception(RAY_TIMEOUT)  # noqa: TRY002 - what Ray raises
        return real_init(**kwargs)

    monkeypatch.setattr(ray, "init", slow_once)
    with start_cluster(cluster_settings("cluster.num_cpus=1")) as handle:
        assert ray.is_initialized() and handle.owns_connection
        assert handle.dashboard_url is None, "no dashboard runs (cluster.include_dashboard=false)"
    assert len(tries) == 2 and not ray.is_initialized()


def test_other_start_errors_are_not_retried(monkeypatch):
    tries = []

    def broken(**kwargs):
        tries.append(1)
        raise ValueError("bad resources")

    monkeypatch.setattr(ray, "init", broken)
    with pytest.raises(ValueError, match="bad resources"):
        start_cluster(cluster_settings())
    assert len(tries) == 1


class Started:
    """What `ray.init` returns, as far as the launcher reads it (`RayContext.dashboard_url`)."""

    def __init__(self, dashboard_url: str) -> None:
        self.dashboard_url = dashboard_url


def test_the_dashboards_address_is_what_ray_init_returned_as_a_url():
    assert launcher.dashboard(Started("127.0.0.1:8265")) == "http://127.0.0.1:8265"
    assert launcher.dashboard(Started("https://head:8265")) == "https://head:8265"
    assert launcher.dashboard(Started("")) is None


def test_sigterm_while_ray_starts_is_sigterm_with_143(monkeypatch):
    """`ray.init` installs a SIGTERM handler of its own (`sys.exit(signum)`) before its node starts;
    a SIGTERM in that wait reaches the run as SIGTERM (143), not as Ray's exit 15."""

    def terminated_while_starting(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # what ray.init sets
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()  # the handler runs before pause returns

    monkeypatch.setattr(ray, "init", terminated_while_starting)
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt) as stopped:
            start_cluster(cluster_settings())
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "the run's handler is kept"
    error, what = how_stopped(stopped.value)
    assert (error, what, error.exit_code) == (RunTerminatedError, "terminated (SIGTERM)", 143)
