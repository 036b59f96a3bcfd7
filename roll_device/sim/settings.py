"""The simulated NPU's settings (`ROLL_SIM_*` environment variables), read where they are used and
checked on every read.

A value that is not what the variable takes (`ROLL_SIM_NPU_COUNT=abc`, `0` or `-2`, a memory of no
bytes) is refused with a one-line `ConfigError` that names the variable, the value and the values it
takes; `check_all()` checks every one at once, which `install()` and the CLI do before any work.
They are read at use (not once at import) because a test or a worker may set one after the
simulation is installed. This module imports nothing heavy: the CLI checks with it before torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from roll_device.errors import ConfigError


@dataclass(frozen=True)
class WholeNumber:
    """A `ROLL_SIM_*` variable that holds a whole number of at least `minimum`."""

    env: str
    default: int
    minimum: int
    meaning: str  # what to give, as the error says it

    def value(self) -> int:
        raw = os.environ.get(self.env)
        if raw is None:
            return self.default
        try:
            number = int(raw.strip())
        except ValueError:
            raise self._refused(raw, "is not a whole number") from None
        if number < self.minimum:
            raise self._refused(raw, f"is below {self.minimum}")
        return number

    def _refused(self, raw: str, why: str) -> ConfigError:
        return ConfigError(f"{self.env}={raw!r} {why}: give {self.meaning} (default {self.default})")


@dataclass(frozen=True)
class Text:
    """A `ROLL_SIM_*` variable that holds a name (not blank)."""

    env: str
    default: str
    meaning: str

    def value(self) -> str:
        raw = os.environ.get(self.env)
        if raw is None:
            return self.default
        if not raw.strip():
            raise ConfigError(f"{self.env}={raw!r} is blank: give {self.meaning} (default {self.default!r})")
        return raw.strip()


COUNT = WholeNumber("ROLL_SIM_NPU_COUNT", 8, 1, "the number of simulated NPUs, a whole number of 1 or more")
MEMORY_BYTES = WholeNumber(
    "ROLL_SIM_NPU_MEMORY_BYTES",
    64 << 30,
    1,
    "each simulated NPU's memory in bytes, a whole number of 1 or more (17179869184 is 16 GiB)",
)
STREAMS = WholeNumber(
    "ROLL_SIM_NPU_STREAMS",
    2048,
    1,
    "the number of streams of each simulated NPU, a whole number of 1 or more",
)
NAME = Text("ROLL_SIM_NPU_NAME", "Ascend910B2", "the device name the simulation reports, e.g. Ascend910B3")
ALL = (COUNT, MEMORY_BYTES, STREAMS, NAME)


def check_all() -> None:
    """Refuse the first `ROLL_SIM_*` variable set to a value it does not take (a ConfigError)."""
    for setting in ALL:
        setting.value()
