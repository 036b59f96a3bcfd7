"""The `weight_sync` config section, typed: which path, bucket size, verification, timeout.

```yaml
weight_sync:
  path: auto             # auto | colocated | collective | bridge | rdt
  bucket_bytes: 67108864 # bytes per bucket (a larger tensor travels alone in a bucket of its own size)
  verify: false          # a CRC32 per bucket; a mismatch fails the sync and keeps the old weights
  timeout_s: 600         # how long one side waits for the other before the sync fails
```
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictBool, StrictFloat, StrictInt, field_validator

from roll_device.comm.paths import check_path
from roll_device.settings import Section

MIN_BUCKET_BYTES = 4096


class WeightSyncOptions(Section):
    path: str = Field(description="auto, colocated, collective, bridge or rdt")
    bucket_bytes: Annotated[
        StrictInt, Field(ge=MIN_BUCKET_BYTES, description="bytes per bucket; 64 MiB is a good default")
    ]
    verify: StrictBool = Field(description="a CRC32 per bucket; a mismatch keeps the old weights")
    timeout_s: Annotated[StrictFloat, Field(gt=0, description="seconds one end waits for the other")]

    @field_validator("path")
    @classmethod
    def _known_path(cls, path: str) -> str:
        check_path(path)
        return path
