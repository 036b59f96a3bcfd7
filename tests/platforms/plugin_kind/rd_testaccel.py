"""A plugin platform for a device kind roll-device has never heard of: `testaccel`, a CPU-backed
test device with its own Ray resource (`TESTACCEL`), two devices per node.

It is installed by test_plugin_kind.py as a package of its own (this module plus a dist-info with
an entry point in the group `roll_device.platforms`) and is the worked example of
docs/platforms.md, "Adding a device kind". Each device a worker binds is logged to the file named
by `RD_TESTACCEL_LOG`, so that a test can see that workers computed on this platform. Its devices
report an architecture of their own through the `facts` group: a plugin fills the same groups as the
built-in kinds, by naming its own group class.
"""

from __future__ import annotations

import os

from roll_device.platforms.cpu import CpuFacts, CpuPlatform
from roll_device.platforms.groups import group

DEVICES = 2
LOG_ENV = "RD_TESTACCEL_LOG"
ARCH = "testaccel-1"


class TestAccelFacts(CpuFacts):
    """The host's facts, but the devices' own architecture."""

    def device_arch(self, index: int | None = None) -> str:
        return ARCH


class TestAccelPlatform(CpuPlatform):
    """Identity of its own; computes with the CPU's torch device, gloo collectives, no graphs."""

    kind = "testaccel"
    ray_resource = "TESTACCEL"  # nodes declare it: ray start --resources='{"TESTACCEL": 2}'
    install_hint = "install rd-testaccel"
    facts = group(TestAccelFacts)

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return DEVICES

    def set_device(self, index: int) -> None:
        if not 0 <= index < DEVICES:
            raise ValueError(f"platform '{self.name}': device index {index} out of range: {DEVICES} devices")
        if os.environ.get(LOG_ENV):
            with open(os.environ[LOG_ENV], "a") as log:
                log.write(f"{os.getpid()} {self.kind} {index}\n")
