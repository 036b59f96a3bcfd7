"""The `data` config section as checked values: where prompts come from (a toy task, or a file of
records with prompt and answer keys), how they are shuffled and repeated, and the held-out share
kept for evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from roll_device.errors import ConfigError
from roll_device.pipeline.data.arithmetic import GENERATORS


@dataclass(frozen=True)
class DataSettings:
    task: str  # the toy task whose prompts and rule are used when `path` is null
    path: str | None
    format: str
    prompt_key: str
    answer_key: str
    shuffle: bool
    epochs: int | None  # null: cycle through the data until max_steps
    eval_size: float  # < 1: a fraction of the records; >= 1: a count
    eval_path: str | None  # a separate eval file (then eval_size caps how many of its rows)
    prompts_per_step: int
    prompt_length: int  # letters per toy-task prompt
    seed: int
    generate: str | None = None  # a dataset roll-device writes at `path` / `eval_path` when absent

    @classmethod
    def from_config(cls, cfg: DictConfig) -> DataSettings:
        data = cfg.data
        settings = cls(
            task=data.get("task", "digits"),
            path=_optional_path(data.get("path")),
            format=data.get("format", "auto"),
            prompt_key=data.get("prompt_key", "question"),
            answer_key=data.get("answer_key", "answer"),
            shuffle=bool(data.get("shuffle", True)),
            epochs=data.get("epochs"),
            eval_size=float(data.get("eval_size", 0)),
            eval_path=_optional_path(data.get("eval_path")),
            prompts_per_step=int(data.prompts_per_step),
            prompt_length=int(data.get("prompt_length", 0)),
            seed=int(cfg.seed),
            generate=data.get("generate"),
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse values no run can use (the files themselves are read by `load_source`)."""
        if self.generate is not None:
            if self.generate not in GENERATORS:
                raise ConfigError(
                    f"data.generate='{self.generate}' is unknown: choose {', '.join(GENERATORS)}"
                )
            if self.path is None or self.eval_path is None:
                raise ConfigError(
                    f"data.generate={self.generate} writes data.path and data.eval_path: set both"
                )
            return
        for key, value in (("data.path", self.path), ("data.eval_path", self.eval_path)):
            if value is not None and not Path(value).exists():
                raise ConfigError(f"{key}={value} does not exist: give a .jsonl, .parquet or datasets folder")
        if self.eval_path is not None and self.path is None:
            raise ConfigError("data.eval_path is set but data.path is null: evaluation files need a dataset")


def _optional_path(value) -> str | None:
    return None if value in (None, "") else str(Path(str(value)).expanduser())
