"""What a run reads besides its model weights: the prompt source, the prompt encoder (chat
template switch), the reward it is scored with and its evaluation settings.

`check_inputs(cfg)` refuses bad values (a missing path, an unknown reward, a reward that needs
reference answers the data lacks) with one line before Ray starts; `read_data` then reads the
data (refusing a missing key or an empty file) on the driver, also before Ray starts.
`load_inputs` makes the encoder from the tokenizer (`load_tokenizer`, which the driver runs while
Ray starts) and drops the prompts too long for the engine, before any worker starts. (The model
directory is checked where a run loads it, `experiment.model_path`: `plan` and `doctor` check
layouts whose model lives on the cluster.)
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from roll_device.errors import ConfigError
from roll_device.pipeline.data import DataSettings, PromptSource, load_source
from roll_device.pipeline.evaluation import EvalSettings
from roll_device.pipeline.output import quiet_transformers
from roll_device.pipeline.prompts import PromptEncoder
from roll_device.pipeline.rewards import BUILT_IN, resolve_reward


@dataclass(frozen=True)
class RewardSettings:
    function: str | None  # math | exact | a dotted path | null (the toy task's rule)
    task: str

    @classmethod
    def from_config(cls, cfg: DictConfig) -> RewardSettings:
        return cls(function=(cfg.get("reward") or {}).get("function"), task=cfg.data.get("task", "digits"))

    @property
    def name(self) -> str:
        return self.function or f"task:{self.task}"

    def check(self, data: DataSettings) -> None:
        resolve_reward(self.function, self.task)  # an unknown name or failing import is refused here
        if self.function is None and data.path is not None:
            raise ConfigError(
                f"data.path={data.path} needs a reward that compares with its answers: set "
                f"reward.function to {', '.join(BUILT_IN)} or a dotted path module.function"
            )
        if self.function in BUILT_IN and data.path is None:
            raise ConfigError(
                f"reward.function={self.function} compares responses with reference answers: set data.path "
                "to a dataset (the toy data.task has none)"
            )


def check_inputs(cfg: DictConfig) -> None:
    """What crosses the data and reward settings (their ranges are the schema's)."""
    data = DataSettings.from_config(cfg)
    RewardSettings.from_config(cfg).check(data)


@dataclass(frozen=True)
class RunInputs:
    source: PromptSource
    encoder: PromptEncoder
    reward: RewardSettings
    evaluation: EvalSettings
    eval_samples: list
    last_step: int  # max_steps, or fewer when data.epochs runs out first


def last_step(cfg: DictConfig, source: PromptSource) -> int:
    """`max_steps`, or fewer when `data.epochs` runs out first (said once)."""
    available = source.steps_available(cfg.data.prompts_per_step)
    if available is None or available >= cfg.max_steps:
        return cfg.max_steps
    if available < 1:
        raise ConfigError(
            f"data.epochs={cfg.data.epochs} gives less than one step of data.prompts_per_step="
            f"{cfg.data.prompts_per_step} prompts: raise data.epochs or lower data.prompts_per_step"
        )
    print(f"data: {cfg.data.epochs} epoch(s) of the data last {available} steps: the run ends there")
    return available


def read_data(cfg: DictConfig) -> PromptSource:
    """The run's prompts as the data gives them (a missing key or an empty file refused)."""
    return load_source(DataSettings.from_config(cfg))


def load_tokenizer(model_path: str):
    """The model's tokenizer (imports transformers: about 2 s on 2 cores)."""
    from transformers import AutoTokenizer

    quiet_transformers()
    return AutoTokenizer.from_pretrained(model_path)


def load_inputs(cfg: DictConfig, tokenizer, model_path: str, data: PromptSource) -> RunInputs:
    """The encoder and the rest of the inputs; prompts of `data` too long for the engine dropped."""
    encoder = PromptEncoder(tokenizer, bool(cfg.model.get("chat_template", True)), model_path)
    budget = cfg.rollout.max_model_len - cfg.algorithm.max_new_tokens
    source = data.fitting(lambda s: len(encoder.encode(s.prompt)) <= budget)
    evaluation = EvalSettings.from_config(cfg)
    eval_samples = []
    if evaluation.enabled:
        eval_samples = source.eval_samples(evaluation.size)
        workers = cfg.roles.actor_infer.num_devices
        if len(eval_samples) < workers:
            raise ConfigError(
                f"eval.every_n_steps={evaluation.every_n_steps} needs at least {workers} held-out prompts "
                f"(one per actor_infer worker), the data gives {len(eval_samples)}: set data.eval_size "
                "(or eval.size for a toy task), or eval.every_n_steps=0"
            )
    reward = RewardSettings.from_config(cfg)
    return RunInputs(source, encoder, reward, evaluation, eval_samples, last_step(cfg, source))
