"""The `logger` list and the `tracking` and `profile` sections (docs/observability.md).

`logger` names trackers of the registry (roll_device/tracking/registry.py); an unknown name is
refused with the list. `profile` chooses the steps and roles whose workers record a trace and
what they record (`cpu`: host activity, `device`: the kind's device activity). What crosses
sections (a profiled step beyond `max_steps`, a profiled role the run does not start) is checked
by the run's configuration (roll_device/pipeline/config.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, field_validator

from roll_device.settings import Section

ACTIVITIES = ("cpu", "device")
MODES = ("offline", "online")


class TrackingSettings(Section):
    """What the trackers are told: the project, offline or online, MLflow's store; how many of each
    step's responses the run writes beside its metrics (roll_device/pipeline/generations.py)."""

    project: str = Field(description="the tracker's project (wandb, swanlab) or experiment (mlflow)")
    mode: Literal[MODES] = Field(
        description="offline writes wandb's and swanlab's runs under the run directory"
    )
    mlflow_tracking_uri: str | None = Field(description="null: a file store under the run directory")
    generations: Annotated[
        StrictInt, Field(ge=0, description="responses of each step and evaluation to generations.jsonl")
    ]


class ProfileSettings(Section):
    """Which steps of which roles the platform's profiler records, and what it records."""

    steps: list[Annotated[StrictInt, Field(ge=1)]] = Field(
        description="the steps to profile, from 1; []: none"
    )
    roles: list[str] = Field(description="the roles whose workers record a trace")
    activities: list[Literal[ACTIVITIES]] = Field(min_length=1, description="cpu and/or device")

    @field_validator("steps", "roles", "activities")
    @classmethod
    def _once_each(cls, values: list) -> list:
        if len(set(values)) != len(values):
            raise ValueError("name each entry once")
        return values

    @property
    def enabled(self) -> bool:
        return bool(self.steps)

    def covers(self, step: int) -> bool:
        return step in self.steps
