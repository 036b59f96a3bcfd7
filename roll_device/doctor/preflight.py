"""The preflight of `run`: the doctor's checks on every node of a plan, before any worker starts.

`preflight(plan, requests)` sends one small Ray task to each node of the plan (pinned there with
`NodeAffinitySchedulingStrategy`, no CPU, so it never waits behind placement groups; a fresh worker
process each, `max_calls=1`, since a simulated node's task installs the simulated NPU, which
renames a torch device for the rest of the process). Each task gathers that node's installed
facts and capabilities, as the kind the node serves (a simulated NPU node as the simulated NPU),
and checks the roles placed there. Any problem ends the run with a `PreflightError`: one line per
node and problem.

The driver's own node, when it serves only the host kind (not simulated), is checked in the
driver instead, with the same `check_node`: its workers run the driver's interpreter and packages
(the job's runtime env), and a task would only add a process start (about 3 s on 2 cores, most of
the default job's preflight).
"""

from __future__ import annotations

from roll_device.cluster.plan import Plan
from roll_device.doctor.capabilities import capabilities_of
from roll_device.doctor.checks import Problem, RoleRequest, node_problems
from roll_device.doctor.facts import declared_packages, gather_facts
from roll_device.doctor.report import problems_message
from roll_device.errors import RollDeviceError
from roll_device.platforms import HOST_KIND

TIMEOUT_S = 120.0


class PreflightError(RollDeviceError, RuntimeError):
    """A node of the plan cannot serve the roles placed on it: one line per node and problem."""


def check_node(requests: list[RoleRequest]) -> list[Problem]:
    """The problems of this node for the roles `requests` place here (runs in the node's task)."""
    packages = declared_packages()
    facts = gather_facts(packages)
    caps = {r.kind: capabilities_of(r.kind, r.simulated) for r in requests}
    return node_problems(requests, caps, facts, packages)


def checkable_here(node_id: str, requests: list[RoleRequest], driver_node_id: str) -> bool:
    """Whether the driver can check this node itself: its own node, serving only the host kind."""
    return node_id == driver_node_id and all(r.kind == HOST_KIND and not r.simulated for r in requests)


def preflight(plan: Plan, requests: list[RoleRequest], timeout_s: float = TIMEOUT_S) -> int:
    """Check every node of `plan`; returns how many nodes were checked, or raises `PreflightError`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    by_node: dict[str, list[RoleRequest]] = {}
    for request in requests:
        by_node.setdefault(request.node_id, []).append(request)
    driver_node = ray.get_runtime_context().get_node_id()
    here = {node_id for node_id, reqs in by_node.items() if checkable_here(node_id, reqs, driver_node)}
    task = ray.remote(num_cpus=0, max_calls=1)(check_node)
    refs = {
        node_id: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            reqs
        )
        for node_id, reqs in by_node.items()
        if node_id not in here
    }
    lines = [p.line() for node_id in here for p in check_node(by_node[node_id])]
    ready = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)[0] if refs else []
    for node_id, ref in refs.items():
        where = f"node {plan.inventory.node(node_id).name}"
        if ref not in ready:
            lines.append(f"{where}: no answer within {timeout_s:g} s (is the node alive? check `ray status`)")
            continue
        try:
            lines += [p.line() for p in ray.get(ref)]
        except ray.exceptions.RayError as exc:
            cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            lines.append(f"{where}: the preflight task failed ({cause})")
    for ref in set(refs.values()) - set(ready):
        ray.cancel(ref, force=True)
    refuse(lines)
    return len(by_node)


def check_here(requests: list[RoleRequest]) -> None:
    """The preflight of a cluster that is this machine alone, in this process before Ray starts
    (its workers will run this interpreter and its packages)."""
    refuse([p.line() for p in check_node(requests)])


def refuse(lines: list[str]) -> None:
    """A PreflightError with one line per problem, when there is any."""
    if lines:
        headline = f"preflight found {len(lines)} problem(s) before any worker started:"
        raise PreflightError(problems_message(headline, lines))
