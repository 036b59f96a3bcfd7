"""roll-device: the device layer for RL post-training on mixed hardware.

`current_platform()` is this process's device kind (detected lazily; `ROLL_DEVICE` overrides);
`get_platform(kind)` is a platform by kind, for workers bound to another kind.
"""

from roll_device.errors import RollDeviceError
from roll_device.platforms import Platform, current_platform, get_platform, known_kinds

__all__ = ["Platform", "RollDeviceError", "current_platform", "get_platform", "known_kinds"]
__version__ = "0.1.0"
