"""`roll-device doctor [overrides]`: the platform detected, installed versions, a capability
table for each device kind the experiment's roles use, and every known-bad combination with its fix.

It checks this machine: roles resolve (`auto` included) and are planned as `run` would plan them
here (`cluster=sim`: on the simulated nodes the config declares), and a model already on disk is
checked against the roles' settings as `run` checks it. Exit 0 when the experiment can
run here; otherwise a `DoctorError` with one line per problem (the CLI exits 2). On a remote
cluster `run` repeats the same checks on every node before any worker starts
(roll_device/doctor/preflight.py).
"""

from __future__ import annotations

from pathlib import Path

from roll_device.commands.gate import check_model, load_config
from roll_device.doctor.capabilities import capabilities_of
from roll_device.doctor.checks import Problem, role_problems, stack_problems
from roll_device.doctor.facts import declared_packages, gather_facts
from roll_device.doctor.report import format_capabilities, format_versions, problems_message
from roll_device.errors import ConfigError, PlanError, RollDeviceError
from roll_device.pipeline.config import RunConfig
from roll_device.pipeline.run_plan import RunPlan, build_run_plan
from roll_device.platforms import current_platform

PLAN = "plan"  # the role of a problem with the plan itself
MODEL = "model"  # ... and of one with what the model allows


class DoctorError(RollDeviceError, RuntimeError):
    """The experiment cannot run here: one line per problem, each with its fix."""


def doctor_command(overrides: list[str]) -> int:
    config = load_config(overrides)
    packages = declared_packages()
    facts = gather_facts(packages)
    print(f"platform detected: {current_platform().name}\n")
    print(format_versions(facts), flush=True)
    problems = stack_problems(facts, packages)
    try:
        plan: RunPlan | None = build_run_plan(config, config.cluster.inventory_here())
    except PlanError as exc:
        plan = None
        problems.append(Problem(PLAN, "-", str(exc)))
    if plan is not None:
        requests = list(plan.requests)
        caps = {(r.kind, r.simulated): None for r in requests}
        caps = {key: capabilities_of(*key) for key in caps}
        print("\ndevice kinds of this experiment:")
        print(format_capabilities(list(caps.values()), requests), flush=True)
        for request in requests:
            problems += role_problems(request, caps[(request.kind, request.simulated)], facts)
    problems += _model_problems(config, plan if config.cluster.plans_before_start else None)
    if problems:
        headline = f"{len(problems)} problem(s) stop this experiment here:"
        raise DoctorError(problems_message(headline, [p.line() for p in problems]))
    print("\nno problems found: the experiment can run here")
    return 0


def _model_problems(config: RunConfig, plan: RunPlan | None) -> list[Problem]:
    """What the model must allow with the roles' settings (`check_model`, told the compute
    platforms of `plan`), for a model already on disk (`model.path`, or the tiny model once made:
    the doctor makes none)."""
    path = Path(config.model.path or config.model.tiny_dir)
    if not (path / "config.json").is_file():
        return []
    try:
        check_model(config, str(path), plan)
    except ConfigError as exc:
        return [Problem(MODEL, "-", str(exc))]
    return []
