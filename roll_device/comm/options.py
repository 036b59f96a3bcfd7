"""The `weight_sync` config group as a checked value: which path, bucket size, verification, timeout.

```yaml
weight_sync:
  path: auto             # auto | colocated | collective | bridge | rdt
  bucket_bytes: 67108864 # bytes per bucket (a tensor larger than a bucket is split across several)
  verify: false          # a CRC32 per bucket; a mismatch fails the sync and keeps the old weights
  timeout_s: 600         # how long one side waits for the other before the sync fails
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roll_device.comm.paths import AUTO, check_path
from roll_device.errors import ConfigError

MIN_BUCKET_BYTES = 4096


@dataclass(frozen=True)
class WeightSyncOptions:
    path: str = AUTO
    bucket_bytes: int = 64 << 20
    verify: bool = False
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_path(self.path)
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int):
            raise ConfigError(f"weight_sync.bucket_bytes must be a whole number, got {self.bucket_bytes!r}")
        if self.bucket_bytes < MIN_BUCKET_BYTES:
            raise ConfigError(
                f"weight_sync.bucket_bytes={self.bucket_bytes} is too small: use at least "
                f"{MIN_BUCKET_BYTES} (64 MiB is a good default)"
            )
        if not isinstance(self.verify, bool):
            raise ConfigError(f"weight_sync.verify must be true or false, got {self.verify!r}")
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or self.timeout_s <= 0
        ):
            raise ConfigError(
                f"weight_sync.timeout_s must be a number of seconds > 0, got {self.timeout_s!r}"
            )

    @classmethod
    def from_config(cls, group: Mapping[str, Any] | None) -> WeightSyncOptions:
        """Options from the `weight_sync` group (a DictConfig or dict); unknown keys are refused."""
        values = dict(group or {})
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"unknown weight_sync key(s) {', '.join(unknown)}: the keys are "
                f"{', '.join(cls.__dataclass_fields__)}"
            )
        return cls(**values)
