"""The `agentic` config section (docs/agentic.md): the environment the `env` role runs, the tools
it offers, the turn budgets, the timeouts and what an environment's fault ends."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat

from roll_device.agentic.host import HostSpec
from roll_device.agentic.registry import resolve_environment, resolve_tool
from roll_device.errors import ConfigError
from roll_device.settings import Count, Section

Seconds = Annotated[StrictFloat, Field(gt=0)]
FAULT_ENDS = ("trajectory", "run")


class AgenticSettings(Section):
    environment: str | None = Field(
        default=None, description="a built-in environment or package.module.Class; null: single-turn"
    )
    tools: list[str] = Field(default_factory=list, description="built-in tools or package.module.name")
    max_turns: Count = 4
    max_turn_tokens: Count = Field(default=8, description="tokens the model may generate in one turn")
    max_total_tokens: Count = Field(default=64, description="tokens after the first prompt, all turns")
    max_prompt_tokens: Count = Field(default=32, description="the longest first prompt (rendered)")
    env_timeout_s: Seconds = 10.0
    tool_timeout_s: Seconds = 5.0
    on_env_fault: Literal[FAULT_ENDS] = Field(default="trajectory", description="what an env fault ends")
    chat_template: str | None = Field(
        default=None, description="null: the tokenizer's; tiny: the tiny model's"
    )

    @property
    def on(self) -> bool:
        return self.environment is not None

    def check_names(self) -> None:
        """Unknown environment or tool names, a tool without a schema: a ConfigError."""
        if self.environment is not None:
            resolve_environment(self.environment)
        elif self.tools:
            raise ConfigError(
                f"agentic.tools={self.tools} but agentic.environment is null: tools run in an "
                "environment's episodes; set agentic.environment"
            )
        for name in self.tools:
            resolve_tool(name)

    def check_budget(self, context: int) -> None:
        """The turn budget fits a context of `context` tokens (rollout.max_model_len)."""
        if self.max_turn_tokens > self.max_total_tokens:
            raise ConfigError(
                f"agentic.max_turn_tokens={self.max_turn_tokens} exceeds agentic.max_total_tokens="
                f"{self.max_total_tokens}: a turn is part of the trajectory; lower it or raise the total"
            )
        if self.max_prompt_tokens + self.max_total_tokens > context:
            raise ConfigError(
                f"the turn budget agentic.max_prompt_tokens + agentic.max_total_tokens ("
                f"{self.max_prompt_tokens} + {self.max_total_tokens}) exceeds rollout.max_model_len "
                f"({context}): lower the budget or raise rollout.max_model_len"
            )

    def host(self, tool_format: str | None) -> HostSpec:
        """What an env worker's host needs, with the template's tool-call format."""
        return HostSpec(
            self.environment, tuple(self.tools), tool_format, self.env_timeout_s, self.tool_timeout_s
        )
