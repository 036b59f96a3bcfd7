"""`roll-device doctor` and the preflight of `run`: what is installed, what each device kind the
experiment uses can do here, and the known-bad combinations, each named with its fix.

- facts.py: installed versions (torch, the platforms' companion packages and toolkits, every
  package a strategy declares), read without importing them;
- capabilities.py: what one platform offers here (graphs, IPC, backend, visible devices, count,
  free memory);
- checks.py: `Problem` values from the facts and each role's request (`RoleRequest`);
- report.py: the printed report (the `doctor` command itself, `doctor_command`, is
  roll_device/commands/doctor.py: it reads the run's configuration through the config gate, then
  plans the roles and checks them with this package);
- preflight.py: the same checks as one small Ray task on every node of a plan, before workers start.
"""

from roll_device.doctor.checks import Problem, RoleRequest

__all__ = ["Problem", "RoleRequest"]
