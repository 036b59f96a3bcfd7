"""The tracker registry: `logger: [console, tensorboard, ...]` names backends registered here
(roll_device/tracking/backends.py), each a small `Tracker` over its tracker's own library.

`Trackers.open(names, context)` starts the named backends for a run; `log(record)` gives every one
the same metrics (`scalars`: the record's numbers, nested keys joined with `/`, under names every
tracker accepts) at the record's step; `close(ok)` ends them. A resumed run (`context.resumed`)
continues the tracker runs its predecessor saved in the run directory's `trackers.json`, where the
tracker can. `check_trackers` refuses, before Ray starts, a backend whose package is not installed
(naming the extra that installs it) or whose settings it can tell are wrong (`Tracker.check`: an
MLflow server where nothing answers); a backend that fails to start anyway ends the run in one
line, before any worker starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from roll_device.errors import ConfigError
from roll_device.tracking.settings import TrackingSettings

STATE_FILE = "trackers.json"  # in the run directory: each tracker's run, for a resumed run
NOT_IN_KEYS = re.compile(r"[^\w\-./ ]")  # MLflow's key alphabet, the narrowest of the trackers'


@dataclass(frozen=True)
class TrackerContext:
    """What a backend starts with: the run directory, the run's name and configuration (logged
    once, by a new run), the `tracking` section, and for a resumed run the state its tracker saved
    (`resumed`, None on a new run) and the step it resumed from."""

    run_dir: Path
    name: str
    config: dict
    settings: TrackingSettings
    resumed: dict | None = None
    start_step: int = 0

    @property
    def new_run(self) -> bool:
        return self.resumed is None


class Tracker:
    """A backend: started with its context, `log(metrics, step)` per record, `log_table` for a
    step's generations, `finish(ok)` at the end; `state()` is what a resumed run needs to continue
    the same tracker run."""

    name: ClassVar[str]
    package: ClassVar[str | None] = None  # the module its library is imported as
    extra: ClassVar[str | None] = None  # the roll-device extra that installs it

    def __init__(self, context: TrackerContext) -> None:
        self.context = context

    @classmethod
    def check(cls, settings: TrackingSettings) -> None:
        """A ConfigError for `settings` this backend can tell will not work, before Ray starts."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """Rows of text and numbers under `name` at `step` (a step's generations); a tracker without
        tables (the console, SwanLab here) leaves them to the run's own file."""

    def finish(self, ok: bool) -> None:
        """End the tracker's run (`ok`: the run ended well)."""

    def state(self) -> dict:
        return {}


TRACKERS: dict[str, type[Tracker]] = {}


def register(cls: type[Tracker]) -> type[Tracker]:
    """Register `cls` under `cls.name`; a different class under a taken name is refused."""
    taken = TRACKERS.get(cls.name)
    if taken is not None and taken is not cls:
        raise ValueError(f"tracker '{cls.name}' is already registered by {taken.__qualname__}")
    TRACKERS[cls.name] = cls
    return cls


def tracker_names() -> list[str]:
    importlib.import_module("roll_device.tracking.backends")  # their registrations
    return list(TRACKERS)


def check_names(names: list[str]) -> list[str]:
    """`names` when each is a registered tracker named once; else a ValueError with the list."""
    known = tracker_names()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown logger {', '.join(unknown)}: choose from {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError("name each logger once")
    return names


def check_trackers(names: list[str], settings: TrackingSettings) -> None:
    """A ConfigError naming the extra of the first tracker in `names` whose package is missing, or
    what its `check` finds wrong with `settings`."""
    tracker_names()
    for name in names:
        cls = TRACKERS[name]
        if cls.package and importlib.util.find_spec(cls.package) is None:
            raise ConfigError(
                f"logger={name}: its package '{cls.package}' is not installed: "
                f"pip install 'roll-device[{cls.extra}]', or leave {name} out of logger"
            )
        cls.check(settings)


def _started(name: str, context: TrackerContext) -> Tracker:
    """The tracker `name` started, or a one-line ConfigError with its library's reason."""
    try:
        return TRACKERS[name](context)
    except ConfigError:
        raise
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(
            f"logger={name}: the tracker did not start ({type(exc).__name__}: {reason}): check its "
            f"settings under tracking (docs/observability.md), or leave {name} out of logger"
        ) from exc


def tracker_key(key: str) -> str:
    """`key` as every tracker takes it (`eval_pass@1` -> `eval_pass_at_1`)."""
    return NOT_IN_KEYS.sub("_", key.replace("@", "_at_"))


def flatten(mapping: dict, sep: str, prefix: str = "") -> dict[str, Any]:
    """The leaves of nested `mapping` by their keys joined with `sep`."""
    found: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            found.update(flatten(value, sep, f"{prefix}{key}{sep}"))
        else:
            found[f"{prefix}{key}"] = value
    return found


def scalars(record: dict) -> dict[str, float]:
    """The numbers of `record` (not its step) under tracker keys, nested keys joined with `/`."""
    return {
        tracker_key(key): float(value)
        for key, value in flatten(record, "/").items()
        if isinstance(value, bool | int | float) and key != "step"
    }


@dataclass
class Trackers:
    """The run's trackers, in `logger`'s order."""

    trackers: list[Tracker] = field(default_factory=list)

    @classmethod
    def open(cls, names: list[str], context: TrackerContext) -> Trackers:
        """Start the trackers `names`; a resumed run's continue from its `trackers.json`."""
        path = context.run_dir / STATE_FILE
        saved = json.loads(path.read_text()) if not context.new_run and path.exists() else {}
        tracker_names()
        opened = cls()
        try:
            for name in names:
                own = None if context.new_run else saved.get(name)  # None: this tracker starts its run
                opened.trackers.append(_started(name, replace(context, resumed=own)))
        except BaseException:
            opened.close(ok=False)
            raise
        path.write_text(json.dumps({t.name: t.state() for t in opened.trackers}, indent=1))
        return opened

    def log(self, record: dict[str, Any]) -> None:
        metrics = scalars(record)
        for tracker in self.trackers:
            tracker.log(metrics, int(record["step"]))

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        for tracker in self.trackers:
            tracker.log_table(name, rows, step)

    def close(self, ok: bool) -> None:
        for tracker in self.trackers:
            tracker.finish(ok)
        self.trackers = []
