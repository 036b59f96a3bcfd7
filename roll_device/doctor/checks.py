"""The doctor's checks: installed facts and each role's request in, `Problem` values out.

Two families:
- stack problems (role '-'): builds that install the same module (`Package.conflicts`), releases
  that must match and do not (`Package.matches`: torch_npu and torch, vLLM-Ascend and vLLM), and
  torchvision built for another torch build than the installed one;
- role problems: no usable device of the role's kind, fewer visible devices than the plan places,
  a package the role's strategy needs on its kind, and settings the strategy cannot honour there
  (a graph mode the installed engine or the device lacks, a sleep level it does not have).

What a strategy needs comes from the strategy itself (`requirements(kind)`, `settings_need`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from roll_device.doctor.capabilities import Capabilities
from roll_device.doctor.facts import TORCH, TORCHVISION, StackFacts
from roll_device.errors import ConfigError
from roll_device.packages import Package, local_label, release_parts
from roll_device.settings import Section
from strategies.base import NO_GRAPHS, Requirements
from strategies.registry import strategy_class

STACK = "stack"  # the role of a problem that concerns the node's installed software
INSTALL_DOCS = "docs/install.md"


@dataclass(frozen=True)
class Problem:
    """One thing that stops the experiment here, and what to do about it."""

    role: str
    kind: str
    message: str
    fix: str = ""
    node: str = ""

    def line(self) -> str:
        where = self.role if self.kind == "-" else f"role {self.role} ({self.kind})"
        node = f"node {self.node}: " if self.node else ""
        return f"{node}{where}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class RoleRequest:
    """One role as placed on one node: its kind, the device slots of that kind the plan uses on
    the node, and the strategy (None for a role without a registered strategy) with its settings
    (its config section; `colocated`: it shares its devices with a trainer)."""

    role: str
    kind: str
    node_id: str
    node_name: str
    simulated: bool
    devices: int
    strategy_type: str | None
    strategy: str
    settings: Section | None = None
    colocated: bool = False


def stack_problems(facts: StackFacts, packages: list[Package]) -> list[Problem]:
    problems = {}
    for package in packages:
        for problem in (_conflict(package, facts), _mismatch(package, facts)):
            if problem is not None:
                problems[problem.message] = problem
    torchvision = _torchvision_build(facts)
    return list(problems.values()) + ([torchvision] if torchvision else [])


def _conflict(package: Package, facts: StackFacts) -> Problem | None:
    builds = sorted(d for d in (package.distribution, *package.conflicts) if facts.version(d))
    if len(builds) < 2:
        return None
    found = " and ".join(f"{d} {facts.version(d)}" for d in builds)
    return Problem(
        STACK,
        "-",
        f"{found} are both installed: each installs the `{package.module}` module over the other",
        f"pip uninstall -y {' '.join(builds)}, then install the one for this node's device kind ({INSTALL_DOCS})",
    )


def _mismatch(package: Package, facts: StackFacts) -> Problem | None:
    if package.matches is None:
        return None
    target, parts = package.matches
    mine, theirs = facts.version(package.distribution), facts.version(target)
    if not (mine and theirs) or release_parts(mine, parts) == release_parts(theirs, parts):
        return None
    wanted = ".".join(str(n) for n in release_parts(mine, parts))
    return Problem(
        STACK,
        "-",
        f"{package.distribution} {mine} is released for {target} {wanted}, but {target} {theirs} is installed",
        f"install {target}=={wanted}.* or the {package.distribution} release for {target} {theirs} ({INSTALL_DOCS})",
    )


def _torchvision_build(facts: StackFacts) -> Problem | None:
    torch, torchvision = facts.version(TORCH), facts.version(TORCHVISION)
    if not (torch and torchvision) or local_label(torch) == local_label(torchvision):
        return None
    return Problem(
        STACK,
        "-",
        f"{TORCHVISION} {torchvision} is a build for another torch than torch {torch}: its import fails "
        "(operator torchvision::nms does not exist) and with it every transformers model import",
        f"pip uninstall -y {TORCHVISION} torchaudio torchcodec (text models do not need them), or install "
        f"{TORCHVISION} from torch's own index",
    )


def role_problems(request: RoleRequest, caps: Capabilities, facts: StackFacts) -> list[Problem]:
    """What stops `request`'s role on this node."""
    if not caps.available:
        return [_problem(request, caps.unavailable_reason, caps.install_hint)]
    problems = []
    if caps.accelerator and caps.computes_as_kind and (caps.device_count or 0) < request.devices:
        shown = f"{caps.visible_env}={caps.visible_value}" if caps.visible_value is not None else "all shown"
        message = (
            f"the plan places {request.devices} {request.kind} device slot(s) on this node, but "
            f"{caps.device_count} are visible here ({shown})"
        )
        fix = (
            f"let {caps.visible_env} list every device of the node (Ray narrows it per worker) or lower "
            f"roles.{request.role}.num_devices"
        )
        problems.append(_problem(request, message, fix))
    if request.strategy_type is None:
        return problems
    return problems + _strategy_problems(request, caps, facts)


def _problem(request: RoleRequest, message: str, fix: str = "") -> Problem:
    return Problem(request.role, request.kind, message, fix, node=request.node_name)


def _strategy_problems(request: RoleRequest, caps: Capabilities, facts: StackFacts) -> list[Problem]:
    kind, computes_as = caps.compute_kind, caps.compute_platform
    try:
        cls = strategy_class(request.strategy_type, request.strategy, computes_as)
        needs = cls.requirements(computes_as)
        wants = cls.settings_need(computes_as, request.settings, request.colocated)
    except ConfigError as exc:
        return [_problem(request, str(exc))]
    label = f"the {request.strategy} strategy on {kind}"
    missing = [
        _missing(request, label, package, facts, wants.graph_mode)
        for package in needs.packages
        if not facts.version(package.distribution)
    ]
    if missing:
        return missing
    found = []
    modes = offered_graph_modes(needs, caps)
    if wants.graph_mode not in modes:
        message = (
            f"roles.{request.role} asks for graph mode {wants.graph_mode}, which {label} does not have "
            f"here (it has {', '.join(modes)}; device graphs: {caps.graph_class or 'none'})"
        )
        fix = f"choose one of {', '.join(modes)} in the role's {request.strategy} settings, or run eager"
        found.append(_problem(request, message, fix))
    if wants.sleep_level is not None and wants.sleep_level not in needs.sleep_levels:
        levels = ", ".join(map(str, needs.sleep_levels)) or "none"
        message = (
            f"roles.{request.role} sleeps at level {wants.sleep_level} while colocated, but {label} has "
            f"sleep levels: {levels}"
        )
        found.append(
            _problem(request, message, "turn sleeping off in the role's settings or do not colocate it")
        )
    return found


def offered_graph_modes(needs: Requirements, caps: Capabilities) -> tuple[str, ...]:
    """The graph modes a strategy has on this node: its declared ones where the device has graphs
    here, else none but eager."""
    return needs.graph_modes if caps.graph_class else tuple(m for m in needs.graph_modes if m == NO_GRAPHS)


def _missing(
    request: RoleRequest, label: str, package: Package, facts: StackFacts, graph_mode: str
) -> Problem:
    other = next((d for d in package.conflicts if facts.version(d)), None)
    if other is None:
        message = (
            f"{label} needs the package {package.module} ({package.distribution}), which is not installed"
        )
        fix = f"install {package.distribution} ({INSTALL_DOCS}) or run the role on another kind or strategy"
        return _problem(request, message, fix)
    graphs = (
        f"; graph mode {graph_mode} needs the engine built for this kind" if graph_mode != NO_GRAPHS else ""
    )
    message = (
        f"{label} needs {package.distribution} for its {package.module} module, but {other} "
        f"{facts.version(other)} (a build for another device kind) is installed{graphs}"
    )
    return _problem(
        request, message, f"pip uninstall -y {other} && pip install {package.distribution} ({INSTALL_DOCS})"
    )


def node_problems(
    requests: list[RoleRequest], caps: dict[str, Capabilities], facts: StackFacts, packages: list[Package]
) -> list[Problem]:
    """Every problem of one node: its stack once, then each role placed there."""
    node = requests[0].node_name if requests else ""
    problems = [replace(p, node=node) for p in stack_problems(facts, packages)]
    for request in requests:
        problems += role_problems(request, caps[request.kind], facts)
    return problems
