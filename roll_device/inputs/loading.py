"""The driver's loading of a run's inputs, before any worker starts: the files the `data` section
names (`check_files`, on the machine where the run runs, not where it is submitted), the prompt
source (`read_data`), the tokenizer (`load_tokenizer`, which the driver runs while Ray starts),
and `load_inputs`: the encoder, the prompts too long for the engine dropped, the held-out samples
evaluation needs, and the step the run ends at.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from roll_device.errors import ConfigError
from roll_device.inputs.prompts import PromptEncoder
from roll_device.inputs.reward_model import check_reward_model_dir
from roll_device.inputs.rewards import reward_caller
from roll_device.inputs.settings import DataSettings, EvalSettings, RewardSettings
from roll_device.inputs.sources import PromptSource, Sample, load_source


@dataclass(frozen=True)
class RunInputs:
    source: PromptSource
    encoder: PromptEncoder
    eval_samples: list[Sample]
    last_step: int  # max_steps, or fewer when data.epochs runs out first


def check_files(data: DataSettings, reward: RewardSettings, longest: int) -> None:
    """The data files exist (or will be generated), and the reward function imports or the reward
    model's folder holds one that reads `longest` tokens (`rollout.max_model_len`), here."""
    if data.generate is None:
        for key, value in (("data.path", data.path), ("data.eval_path", data.eval_path)):
            if value is not None and not Path(value).exists():
                raise ConfigError(f"{key}={value} does not exist: give a .jsonl, .parquet or datasets folder")
    if reward.model_path is not None:  # the reward model scores (the config refused a function beside)
        check_reward_model_dir(reward.model_path, longest)
        return
    reward_caller(reward.function, data.task, reward.name(data.task), reward.kwargs)  # refused here


def read_data(data: DataSettings, seed: int) -> PromptSource:
    """The run's prompts as the data gives them (a missing key or an empty file refused)."""
    return load_source(data, seed)


def load_tokenizer(model_path: str):
    """The model's tokenizer (imports transformers: about 2 s on 2 cores)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoTokenizer.from_pretrained(model_path)


def last_step(data: DataSettings, max_steps: int, source: PromptSource) -> int:
    """`max_steps`, or fewer when `data.epochs` runs out first (said once)."""
    available = source.steps_available(data.prompts_per_step)
    if available is None or available >= max_steps:
        return max_steps
    if available < 1:
        raise ConfigError(
            f"data.epochs={data.epochs} gives less than one step of data.prompts_per_step="
            f"{data.prompts_per_step} prompts: raise data.epochs or lower data.prompts_per_step"
        )
    print(f"data: {data.epochs} epoch(s) of the data last {available} steps: the run ends there")
    return available


def load_inputs(
    data: DataSettings,
    evaluation: EvalSettings,
    source: PromptSource,
    encoder: PromptEncoder,
    *,
    prompt_budget: int,
    rollout_workers: int,
    max_steps: int,
) -> RunInputs:
    """The inputs of a run: prompts longer than `prompt_budget` tokens dropped, the held-out
    samples an evaluation across `rollout_workers` needs."""
    source = source.fitting(lambda s: len(encoder.encode(s.prompt, s.chat())) <= prompt_budget)
    eval_samples = []
    if evaluation.enabled:
        eval_samples = source.eval_samples(evaluation.size)
        if len(eval_samples) < rollout_workers:
            raise ConfigError(
                f"eval.every_n_steps={evaluation.every_n_steps} needs at least {rollout_workers} held-out "
                f"prompts (one per actor_infer worker), the data gives {len(eval_samples)}: set "
                "data.eval_size (or eval.size for a toy task), or eval.every_n_steps=0"
            )
    return RunInputs(source, encoder, eval_samples, last_step(data, max_steps, source))
