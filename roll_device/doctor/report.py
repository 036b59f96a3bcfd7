"""The doctor's printed report: installed versions, one capability column per device kind the
experiment uses, and problems as one line each."""

from __future__ import annotations

from roll_device.cluster.inventory import format_table
from roll_device.doctor.capabilities import Capabilities
from roll_device.doctor.checks import RoleRequest, offered_graph_modes
from roll_device.doctor.facts import StackFacts
from roll_device.errors import ConfigError
from strategies.registry import strategy_class

NOT_INSTALLED = "not installed"
GIB = float(1 << 30)


def format_versions(facts: StackFacts) -> str:
    rows = [("package", "version")]
    rows += [(name, version or NOT_INSTALLED) for name, version in facts.versions.items()]
    rows += [(f"{name} (toolkit)", version or NOT_INSTALLED) for name, version in facts.toolkits.items()]
    return format_table(rows)


def format_capabilities(caps: list[Capabilities], requests: list[RoleRequest]) -> str:
    """Capabilities as rows, one column per kind; graph modes and sleep levels per strategy."""
    header = ("capability", *(c.kind + (" (simulated)" if c.platform != c.kind else "") for c in caps))
    rows = [
        ("computes on", *(c.platform for c in caps)),
        ("device graphs", *(c.graph_class or "no" for c in caps)),
        *_strategy_rows(caps, requests),
        ("IPC", *("yes" if c.ipc else "no (shared memory)" for c in caps)),
        ("collective backend", *(c.backend for c in caps)),
        ("visible devices", *(_visible(c) for c in caps)),
        ("device count", *(_count(c) for c in caps)),
        ("free memory", *(_memory(c) for c in caps)),
    ]
    return format_table([header, *rows])


def _strategy_rows(caps: list[Capabilities], requests: list[RoleRequest]) -> list[tuple[str, ...]]:
    strategies = dict.fromkeys((r.strategy_type, r.strategy) for r in requests if r.strategy_type is not None)
    shared = {name for _, name in strategies if sum(other == name for _, other in strategies) > 1}
    rows = []
    for strategy_type, name in strategies:
        label = f"{strategy_type} {name}" if name in shared else name  # fsdp trains the policy and the critic
        modes, levels = [], []
        for c in caps:
            try:
                needs = strategy_class(strategy_type, name, c.compute_platform).requirements(
                    c.compute_platform
                )
            except ConfigError:
                modes.append("-")
                levels.append("-")
                continue
            modes.append(",".join(offered_graph_modes(needs, c)))
            levels.append(",".join(map(str, needs.sleep_levels)) or "none")
        rows += [(f"graph modes ({label})", *modes), (f"sleep levels ({label})", *levels)]
    return rows


def _visible(c: Capabilities) -> str:
    if c.visible_env is None:
        return "-"
    return f"{c.visible_env}={c.visible_value if c.visible_value is not None else '(unset)'}"


def _count(c: Capabilities) -> str:
    return str(c.device_count) if c.available else "none usable here"


def _memory(c: Capabilities) -> str:
    if c.memory is None:
        return "-"
    free, total = c.memory
    return f"{free / GIB:.1f} of {total / GIB:.1f} GiB"


def problems_message(headline: str, lines: list[str]) -> str:
    """An error message: the headline, then one indented line per problem."""
    return "\n".join([headline, *(f"  {line}" for line in lines)])
