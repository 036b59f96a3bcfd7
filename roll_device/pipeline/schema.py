"""The schema of the whole composed config: every section's keys, types, ranges and choices,
checked in one pass before Ray or any worker starts (pydantic models over the resolved config).

`check_schema(cfg)` raises a `ConfigError` with one line that names the key, the value and what is
allowed (`max_steps='abc': input should be a valid integer`). Each section is one model class;
to add a key, add a field (with `description`: it is the hint printed after a refused value).
`data` and `experiment` keep unknown keys (tasks and experiments add their own). The `trainer`
section is checked by the settings class of the trainer strategy that reads it
(strategies/training/settings.py: its types here, its ranges by its own `check()`), the
`weight_sync` section by `WeightSyncOptions`. Files (`model.path`) are checked by
`check_model_files`, separately, since `plan` and `submit` read configs of other machines.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from omegaconf import DictConfig, OmegaConf
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    create_model,
)

from roll_device.comm.options import WeightSyncOptions
from roll_device.errors import ConfigError, RollDeviceError
from roll_device.models.hf_dir import check_model_dir
from roll_device.pipeline.data.records import FORMATS
from strategies.base import INFERENCE, TRAIN
from strategies.inference.vllm_args import GRAPH_MODES, LOGPROBS_MODES
from strategies.training.settings import FsdpSettings, MegatronSettings

REWARD = "reward"  # the role type of reward workers (the pipeline's own, no strategy registry)
ROLE_TYPES = {"actor_infer": INFERENCE, "actor_train": TRAIN, "reference": TRAIN, "reward": REWARD}
TRAINER_SETTINGS = {"fsdp": FsdpSettings, "megatron": MegatronSettings}
RESUME_CHOICES = (True, False, "latest_valid")
ROLLOUT_DTYPES = ("auto", "float32", "bfloat16", "float16")
DATA_FORMATS = ("auto", *FORMATS)

Count = Annotated[StrictInt, Field(ge=1)]  # also sizes in bytes


class Section(BaseModel):
    """A config section: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class OpenSection(BaseModel):
    """A config section other parts add keys to: unknown keys are kept."""

    model_config = ConfigDict(extra="allow")


class ModelSection(Section):
    path: str | None = Field(None, description="a Hugging Face model directory, or null for the tiny model")
    tiny_dir: str
    tiny_layers: Count
    tiny_hidden: Annotated[StrictInt, Field(ge=32, description="attention heads need 32 dims or more")]
    chat_template: StrictBool = True


class RoleSection(Section):
    device: str = "auto"
    num_devices: Count = 1
    strategy: str
    colocate_with: str | None = None


RolesSection = create_model(
    "RolesSection",
    __base__=Section,
    **{role: (RoleSection | None, None) for role in ROLE_TYPES},  # `roles.<role>=null` drops one
)


class DataSection(OpenSection):
    task: str
    prompts_per_step: Count
    prompt_length: Count
    path: str | None = None
    format: Literal[DATA_FORMATS] = "auto"
    prompt_key: str = "question"
    answer_key: str = "answer"
    shuffle: StrictBool = True
    epochs: Count | None = Field(None, description="null cycles until max_steps")
    eval_size: Annotated[float, Field(ge=0, description="0 (none), a fraction < 1, or a count")] = 0
    eval_path: str | None = None
    generate: str | None = None


class RewardSection(Section):
    function: str | None = Field(None, description="math, exact, a dotted path, or null for the task's rule")


class EvalSection(Section):
    every_n_steps: Annotated[StrictInt, Field(ge=0, description="0 turns evaluation off")] = 0
    size: Count | None = Field(None, description="null evaluates every held-out prompt")
    max_new_tokens: Count | None = None


class AlgorithmSection(Section):
    samples_per_prompt: Annotated[
        StrictInt, Field(ge=2, description="GRPO compares samples of one prompt, use 2 or more")
    ]
    max_new_tokens: Count
    temperature: Annotated[float, Field(ge=0, description="0 samples greedily")]
    clip_ratio: Annotated[float, Field(gt=0)]
    kl_coef: Annotated[float, Field(ge=0, description="0 runs without the reference role")]
    ppo_epochs: Count


class ExperimentSection(OpenSection):
    name: str


class ClusterSection(OpenSection):
    name: Literal["local", "sim", "remote"]
    address: str | None = None
    num_cpus: Annotated[StrictInt, Field(ge=1, description="null: all of this machine's")] | None = None
    resources: dict[str, Annotated[float, Field(ge=0)]] | None = None
    include_dashboard: StrictBool = False
    cpu_per_worker: Annotated[float, Field(gt=0, le=64, description="CPUs each CPU-role worker reserves")] = (
        0.25
    )


class RolloutSection(Section):
    """Keys every rollout engine reads."""

    name: str
    max_model_len: Count
    dtype: Literal[ROLLOUT_DTYPES]
    update_bucket_bytes: Count
    logprobs_mode: Literal[LOGPROBS_MODES]
    capture_sizes: list[Count] | None = None


class VllmRollout(RolloutSection):
    max_num_seqs: Count
    tensor_parallel_size: Annotated[
        StrictInt,
        Field(
            ge=1,
            le=1,
            description="each actor_infer worker runs one engine on its one device: more engines "
            "come from roles.actor_infer.num_devices",
        ),
    ] = 1
    enforce_eager: StrictBool | None = None
    graph_mode: Literal[GRAPH_MODES] | None = None
    kv_cache_bytes: Count | None = None
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    colocated: StrictBool = False
    sleep_when_colocated: StrictBool = True
    seed: StrictInt = 0
    env: dict[str, str | int | float | bool] = {}


class HfRollout(RolloutSection):
    max_batch_size: Count
    use_graphs: StrictBool | None = None
    prefill_graphs: StrictBool = False
    prefill_capture_sizes: list[Count] | None = None


ROLLOUT_SECTIONS = {"vllm": VllmRollout, "hf": HfRollout}


class RunSchema(Section):
    """The top level: run keys and the sections."""

    seed: StrictInt
    max_steps: Annotated[StrictInt, Field(ge=1, description="a run needs at least one step")]
    resume: Literal[RESUME_CHOICES] = Field(
        description="latest_valid: the newest checkpoint that passes its checks"
    )
    save_every: Annotated[StrictInt, Field(ge=0, description="0 checkpoints only at the end")]
    model: ModelSection
    roles: RolesSection
    weight_sync: dict[str, Any]
    data: DataSection
    reward: RewardSection = RewardSection()
    eval: EvalSection = EvalSection()
    algorithm: AlgorithmSection
    experiment: ExperimentSection
    cluster: ClusterSection
    trainer: dict[str, Any]
    rollout: dict[str, Any]


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain values, interpolations resolved (a ConfigError naming a broken one)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{exc.full_key}: {str(exc).splitlines()[0]}") from exc


def check_schema(cfg: DictConfig) -> RunSchema:
    """Every section of `cfg` against its schema; the first bad value as one ConfigError."""
    values = resolved(cfg)
    run = _validated(RunSchema, values, "")
    _validated_dataclass(WeightSyncOptions, run.weight_sync, "weight_sync")
    trainer = run.trainer.get("name")
    if trainer not in TRAINER_SETTINGS:
        raise ConfigError(f"trainer.name={trainer!r}: choose one of {', '.join(TRAINER_SETTINGS)}")
    _validated_dataclass(TRAINER_SETTINGS[trainer], run.trainer, "trainer").check()
    rollout = run.rollout.get("name")
    if rollout not in ROLLOUT_SECTIONS:
        raise ConfigError(f"rollout.name={rollout!r}: choose one of {', '.join(ROLLOUT_SECTIONS)}")
    _validated(ROLLOUT_SECTIONS[rollout], run.rollout, "rollout")
    return run


def check_model_files(cfg: DictConfig) -> None:
    """`model.path`, when set, is a Hugging Face model directory on this machine that the
    strategies can run."""
    if cfg.model.path is None:
        return
    path = Path(str(cfg.model.path)).expanduser()
    fix = "give a directory saved with save_pretrained (with config.json), or model.path=null for the tiny model"
    if not str(cfg.model.path).strip() or not path.exists():
        raise ConfigError(f"model.path='{cfg.model.path}' does not exist: {fix}")
    if not path.is_dir():
        raise ConfigError(f"model.path='{cfg.model.path}' is a file, not a model directory: {fix}")
    check_model_dir(path)  # config.json of a supported family, and a tokenizer


def _validated(model: type[BaseModel], values: Any, section: str) -> Any:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc.errors(include_url=False)[0], model, section)) from None


def _validated_dataclass(cls: type, values: dict[str, Any], section: str) -> Any:
    """A dataclass section: unknown keys refused, types checked, its own `__post_init__` run."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown key {section}.{unknown[0]}: the keys of {section} are {', '.join(known)}")
    try:
        return TypeAdapter(cls).validate_python(values)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc.errors(include_url=False)[0], None, section)) from None


def _one_line(error: dict, model: type[BaseModel] | None, section: str) -> str:
    """`key=value: what is allowed (why)` for one pydantic error."""
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, RollDeviceError):
        return str(cause)
    loc = [str(part) for part in error["loc"] if not str(part).startswith(("function-", "constrained-"))]
    key = ".".join(filter(None, [section, *loc]))
    if error["type"] == "missing":
        return f"{key} is missing: set it (docs/configuration.md lists every key)"
    if error["type"] == "extra_forbidden":
        keys = _keys_at(model, error["loc"][:-1])
        return f"unknown key {key}: " + (f"the keys here are {', '.join(keys)}" if keys else "remove it")
    message = error["msg"][0].lower() + error["msg"][1:]
    hint = _description(model, error["loc"])
    return f"{key}={error['input']!r}: {message}" + (f" ({hint})" if hint else "")


def _walk(model: type[BaseModel] | None, loc: tuple) -> tuple[Any, Any]:
    """(the field at `loc` under `model` or None, the type found there), through nested
    sections, dict values and the union members pydantic names in a location."""
    current, field = model, None
    for part in map(str, loc):
        if get_origin(current) is dict:
            current, field = get_args(current)[1], None
            continue
        models = _models_in(current)
        named = [m for m in models if m.__name__ == part]
        if named:
            current = named[0]
            continue
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        if field is None:
            return None, None
        current = field.annotation
    return field, current


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The sections an annotation holds (itself, or the members of an Optional or a Union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _keys_at(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    return [key for m in _models_in(_walk(model, loc)[1]) for key in m.model_fields]


def _description(model: type[BaseModel] | None, loc: tuple) -> str | None:
    field = _walk(model, loc)[0]
    return None if field is None else field.description
