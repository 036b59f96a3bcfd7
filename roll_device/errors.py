"""Errors roll-device raises for bad input: each names what was wrong and what to do.

The CLI turns any `RollDeviceError` into its one-line message and its `exit_code`: 2 for bad
input (the default, refused before work starts), 1 for a run that failed on the way (a lost
worker, a failed weight sync, an update that was not finite), 130 for a run the user interrupted
(Ctrl-C), 143 for one ended by SIGTERM.
"""


class RollDeviceError(Exception):
    """Base of every error a user can fix by changing input, environment or installation."""

    exit_code = 2


class UnknownDeviceError(RollDeviceError, ValueError):
    """A device kind nobody registered (ROLL_DEVICE, a role's `device`, `get_platform`)."""


class MissingPackageError(RollDeviceError, ImportError):
    """A package a device kind or backend needs is not installed."""


class DeviceUnavailableError(RollDeviceError, RuntimeError):
    """The requested device kind is known but not usable on this machine."""


class ConfigError(RollDeviceError, ValueError):
    """A configuration value is inconsistent or out of range."""


class PlanError(RollDeviceError, RuntimeError):
    """A role plan that does not fit the cluster."""


class WeightSyncError(RollDeviceError, RuntimeError):
    """A weight sync that failed in flight: a checksum mismatch, a side that aborted or timed out.
    With verification on, the rollout keeps the weights it had."""

    exit_code = 1


class CommunicatorError(RollDeviceError, RuntimeError):
    """A process group of Ray actors (a Compiled Graph communicator, a collective group, a direct
    transport) that could not form, or an actor that is not part of it."""
