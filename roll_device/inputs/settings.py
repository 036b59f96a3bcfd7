"""The `data`, `reward` and `eval` config sections, typed: where prompts come from (a toy task, or
a file of records with prompt and answer keys), how they are shuffled, repeated and held out for
evaluation, the reward they are scored with, and how often evaluation runs.

What the sections say on their own is checked here; what needs the files or the reward's module
is checked where the run reads them (`loading.check_files`, `rewards.reward_caller`), since
`plan` and `submit` read configs whose files live on the cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, field_validator, model_validator

from roll_device.errors import ConfigError
from roll_device.inputs.arithmetic import GENERATORS
from roll_device.inputs.records import FORMATS
from roll_device.inputs.rewards import BUILT_IN
from roll_device.inputs.tasks import TASKS
from roll_device.settings import Count, NonNegative, OpenSection, Section, WeightsDtype

DATA_FORMATS = ("auto", *FORMATS)
RULE, MODEL = "rule", "model"  # roles.reward.strategy: a function scores (rewards.py), or a reward model
REWARD_STRATEGIES = (RULE, MODEL)


class DataSettings(OpenSection):
    task: str = Field(description="the toy task whose prompts and rule are used when data.path is null")
    prompts_per_step: Count
    prompt_length: Annotated[Count, Field(description="letters per toy-task prompt; the longest prompt")]
    path: str | None = Field(description="a .jsonl, .parquet or datasets folder; null: the toy task")
    format: Literal[DATA_FORMATS]
    prompt_key: str
    answer_key: str
    shuffle: StrictBool
    epochs: Count | None = Field(description="null cycles until max_steps")
    eval_size: Annotated[StrictFloat, Field(ge=0, description="0 (none), a fraction < 1, or a count")]
    eval_path: str | None = Field(description="a separate evaluation file (eval_size then caps its rows)")
    generate: str | None = Field(description="a dataset roll-device writes at path / eval_path when absent")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        if task not in TASKS:
            raise ValueError(f"unknown task: choose one of {', '.join(sorted(TASKS))}")
        return task

    @field_validator("path", "eval_path")
    @classmethod
    def _expanded(cls, value: str | None) -> str | None:
        return None if value in (None, "") else str(Path(value).expanduser())

    @field_validator("generate")
    @classmethod
    def _known_generator(cls, generate: str | None) -> str | None:
        if generate is not None and generate not in GENERATORS:
            raise ValueError(f"unknown dataset: choose {', '.join(GENERATORS)}")
        return generate

    @model_validator(mode="after")
    def _files_named(self) -> DataSettings:
        if self.generate is not None and (self.path is None or self.eval_path is None):
            raise ConfigError(f"data.generate={self.generate} writes data.path and data.eval_path: set both")
        if self.eval_path is not None and self.path is None:
            raise ConfigError("data.eval_path is set but data.path is null: evaluation files need a dataset")
        return self


class RewardSettings(Section):
    function: str | None = Field(description="math, exact, a dotted path, or null for the task's rule")
    kwargs: dict[str, Any] = Field(
        description="keywords a user function takes beside its sample (verl's reward_kwargs)"
    )
    model_path: str | None = Field(description="a reward model's directory (roles.reward.strategy=model)")
    dtype: WeightsDtype = Field(description="the reward model's weights (auto: its checkpoint's)")
    micro_batch_size: Annotated[Count, Field(description="conversations per forward of the reward model")]

    @model_validator(mode="after")
    def _kwargs_for_a_user_function(self):
        if self.kwargs and (self.function is None or self.function in BUILT_IN):
            raise ConfigError(
                f"reward.kwargs={self.kwargs} is for a user function, and reward.function={self.function or 'null'} "
                "takes none: name your function (reward.function=package.module.function), or drop reward.kwargs"
            )
        return self

    def name(self, task: str) -> str:
        """How the reward is named in reports: the reward model, the function, or the task's rule."""
        if self.model_path is not None:
            return f"model {Path(self.model_path).name}"
        return self.function or f"task:{task}"

    def check_with(self, data: DataSettings, strategy: str) -> None:
        """A reward model (`strategy`) is given as `model_path` and alone; a reward that compares
        with answers needs a dataset that has them, and a dataset needs such a reward (the toy
        task's rule knows no answers)."""
        if strategy == MODEL:
            self._check_model()
            return
        if self.model_path is not None:
            raise ConfigError(
                f"reward.model_path={self.model_path} is read by roles.reward.strategy={MODEL}, and the strategy "
                f"is {strategy}: set roles.reward.strategy={MODEL} (roles.reward.device=auto puts it on an "
                "accelerator), or drop reward.model_path"
            )
        if self.function is None and data.path is not None:
            raise ConfigError(
                f"data.path={data.path} needs a reward that compares with its answers: set "
                f"reward.function to {', '.join(BUILT_IN)} or a dotted path module.function, or score with a "
                f"reward model (roles.reward.strategy={MODEL} reward.model_path=...)"
            )
        if self.function in BUILT_IN and data.path is None:
            raise ConfigError(
                f"reward.function={self.function} compares responses with reference answers: set data.path "
                "to a dataset (the toy data.task has none)"
            )

    def _check_model(self) -> None:
        if self.model_path is None:
            raise ConfigError(
                f"roles.reward.strategy={MODEL} scores with a reward model: set reward.model_path to its "
                "directory (a *ForSequenceClassification checkpoint with one label), or roles.reward.strategy=rule"
            )
        if self.function is not None:
            raise ConfigError(
                f"reward.function={self.function} and the reward model reward.model_path={self.model_path} "
                f"both score responses: keep one (reward.function=null, or roles.reward.strategy={RULE} "
                "and reward.model_path=null)"
            )


class EvalSettings(Section):
    every_n_steps: Annotated[NonNegative, Field(description="0 turns evaluation off")]
    size: Count | None = Field(description="null evaluates every held-out prompt")
    max_new_tokens: Count | None = Field(description="null: algorithm.max_new_tokens")
    samples_per_prompt: Annotated[Count, Field(description="responses per held-out prompt (avg@k, pass@k)")]
    temperature: Annotated[StrictFloat, Field(ge=0, description="0: greedy")]
    top_p: Annotated[StrictFloat, Field(gt=0, le=1, description="nucleus sampling's mass (1: off)")]

    @model_validator(mode="after")
    def _sampled_when_repeated(self) -> EvalSettings:
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise ConfigError(
                f"eval.samples_per_prompt={self.samples_per_prompt} at eval.temperature=0 gives the same greedy "
                "response each time: set eval.temperature > 0 (DAPO's avg@32: 1.0), or eval.samples_per_prompt=1"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.every_n_steps > 0

    def due(self, step: int, last_step: int) -> bool:
        return self.enabled and (step % self.every_n_steps == 0 or step == last_step)
