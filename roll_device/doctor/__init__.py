"""`roll-device doctor` and the preflight of `run`: what is installed, what each device kind the
experiment uses can do here, and the known-bad combinations, each named with its fix.

- facts.py: installed versions (torch, the platforms' companion packages and toolkits, every
  package a strategy declares), read without importing them;
- capabilities.py: what one platform offers here (graphs, IPC, backend, visible devices, count,
  free memory);
- checks.py: `Problem` values from the facts and each role's request (`RoleRequest`);
- report.py: the printed report (the `doctor` command itself is roll_device/pipeline/doctor_command.py,
  above the pipeline whose role settings it reads);
- preflight.py: the same checks as one small Ray task on every node of a plan, before workers start.
"""

from roll_device.doctor.checks import Problem, RoleRequest

__all__ = ["Problem", "RoleRequest"]
