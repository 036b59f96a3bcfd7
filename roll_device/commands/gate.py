"""The config gate every command passes: compose the overrides once (compose.py), read them into
the run's typed configuration (`RunConfig`: every section's types, ranges and choices, and the
rules across sections), and check what can be checked before Ray or any worker starts.

- `load_config(overrides)` / `read_config(cfg)`: the `RunConfig`, or one `ConfigError` line that
  names the key, the bad value and what to do.
- the run's plan on a cluster whose nodes are known before Ray (`plan_here`, pipeline/run_plan.py)
  is made once by the command and handed to the checks below (None elsewhere).
- `check_before_start(config, run_dir, plan)`: what only the machine that runs the job can check
  (the data files and the reward's module, the model directory, the trackers' packages and what they
  can check of their settings (`logger`), the checkpoint a resumed run continues from, or for a new
  run that its folder holds no checkpoints unless `overwrite=true`, the roles on a cluster of this
  machine alone, a submitted job's folder outside Ray's copy of the checkout), then the run's folder
  is made; returns where a resumed run continues (None: afresh). A resumed run is checked against
  the configuration that wrote its checkpoints (the run directory's `config.yaml`): the same
  trainer, model-parallel layout and LoRA adapters.
- `check_same_model(config, model_path, run_dir)`: once the model is on disk, a resumed run's model
  has the shapes of the one its checkpoints were written from.
- `check_model(config, model_path, plan)`: once the model is on disk, what it allows with each
  role's settings, as each strategy checks it (`Strategy.check_model`), and an environment's chat template.
- `check_roles_here(config, plan)` (part of the above): on a cluster of this machine alone, the preflight's checks of
  each role (packages, graph modes, sleep levels the kind has) before Ray starts.
- `check_simulation(config, command)`: `ROLL_DEVICE=npu-sim` on a local cluster, which would run
  every role on the CPU, refused with the command that simulates NPU nodes (`run` and `plan`).

`plan` and `submit` stop after `load_config`: their files live on the cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from roll_device.cluster.submit import SUBMITTED_TO_ENV
from roll_device.commands.compose import compose
from roll_device.commands.models import QWEN_SHAPES
from roll_device.doctor.preflight import check_here
from roll_device.errors import ConfigError
from roll_device.files import make_folder
from roll_device.inputs.loading import check_files
from roll_device.models.hf_dir import SHAPE_KEYS, check_model_dir, model_shape
from roll_device.pipeline.config import ROLE_TYPES, RunConfig
from roll_device.pipeline.run_plan import SYNC_RECEIVER, RunPlan, check_expert_adapters
from roll_device.pipeline.state import CHECKPOINTED, RUN_CONFIG_FILE, Checkpoints, ResumePoint
from roll_device.platforms import Platform, get_platform
from roll_device.platforms.registry import AUTO, ENV_VAR, simulations
from roll_device.settings import read_section
from roll_device.tracking.registry import check_trackers
from strategies.registry import strategy_type


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain values, interpolations resolved (a ConfigError naming a
    broken one)."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{exc.full_key}: {str(exc).splitlines()[0]}") from exc


def read_config(cfg: DictConfig) -> RunConfig:
    """The composed config (its `hydra` node left out) as the run's typed configuration."""
    job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]) if "hydra" in cfg else cfg
    return read_section(RunConfig, resolved(job), "")


def load_config(overrides: list[str] | None = None) -> RunConfig:
    """The run's configuration for `overrides` (Hydra's syntax), composed once and read."""
    return read_config(compose(overrides))


def check_simulation(config: RunConfig, command: str) -> None:
    """A simulation named by `ROLL_DEVICE` (`npu-sim`) lives in the process that sets it: a local
    cluster's Ray node declares only this machine's real devices, so every role would run on the CPU
    without a word. Refused, with the sim cluster's example, whose nodes declare NPUs and whose
    workers there compute on the simulated NPU (docs/cluster.md)."""
    value = os.environ.get(ENV_VAR, "")
    if value in simulations() and config.cluster.on_this_machine:
        raise ConfigError(
            f"{ENV_VAR}={value} simulates {simulations()[value]} devices in this process only: on "
            "cluster=local every role would run on this machine's CPU; to simulate a run on NPU nodes, "
            f"use the sim cluster: roll-device {command} experiment=mixed_devices cluster=sim"
        )


def check_model_files(config: RunConfig) -> None:
    """`model.path`, when set, is a Hugging Face model directory on this machine that the
    strategies can run."""
    given = config.model.path
    if given is None:
        return
    path = Path(given).expanduser()
    fix = "give a directory saved with save_pretrained (with config.json), or model.path=null for the tiny model"
    if not given.strip() or not path.exists():
        raise ConfigError(f"model.path='{given}' does not exist: {_how_to_make(path) or fix}")
    if not path.is_dir():
        raise ConfigError(f"model.path='{given}' is a file, not a model directory: {fix}")
    check_model_dir(path)  # config.json of a supported family, and a tokenizer


def check_critic_files(config: RunConfig) -> None:
    """`critic.model_path`, when a critic runs and it is set, is a model directory (no tokenizer
    needed: the critic reads the policy's tokens)."""
    given = config.critic.model_path
    if config.roles.critic is None or given is None or (Path(given) / "config.json").is_file():
        return
    raise ConfigError(
        f"critic.model_path={given} holds no config.json: give a Hugging Face model directory of the "
        "policy's architecture (saved with save_pretrained), or critic.model_path=null for the policy's"
    )


def _how_to_make(path: Path) -> str:
    """The command that makes a missing model of the project's own shapes (a folder named
    `<shapes>-shaped`, as the shipped experiments name them), or ""."""
    shapes = path.name.removesuffix("-shaped")
    if shapes == path.name or shapes not in QWEN_SHAPES:
        return ""
    return f"make it once with `roll-device make-tiny-model {path} --shapes {shapes}` (no download), or set model.path"


def check_before_start(config: RunConfig, run_dir: Path, plan: RunPlan | None) -> ResumePoint | None:
    """What the machine that runs the job checks before anything starts or is written (the files
    are read once: sizes and CRC32s of a checkpoint); last, the run's folder is made (empty), or
    refused when it cannot be. Returns where a resumed run continues (None: afresh)."""
    check_files(config.data, config.reward, config.rollout.max_model_len)
    check_model_files(config)
    check_critic_files(config)
    check_trackers(config.logger, config.tracking)
    checkpoints = Checkpoints(run_dir)
    if config.resume:
        start = checkpoints.resume_point(config.resume)
        check_same_trainer(config, run_dir)
        check_checkpointed_roles(config, start[0])
    else:
        start = None
        if not config.overwrite:
            checkpoints.refuse_overwrite(run_dir)
    check_roles_here(config, plan)
    check_submitted_run_dir(run_dir)
    make_folder(run_dir, "hydra.run.dir")  # the last check: the run's folder, empty, can be made
    return start


def check_submitted_run_dir(run_dir: Path) -> None:
    """A submitted job runs in Ray's temporary copy of the checkout: a relative run directory
    would put its checkpoints there, lost with the copy."""
    if os.environ.get(SUBMITTED_TO_ENV) and not run_dir.is_absolute():
        raise ConfigError(
            f"hydra.run.dir={run_dir} is relative, and a submitted job's working directory is Ray's "
            "temporary copy of the checkout, where the run's checkpoints would be lost: give an "
            f"absolute path on the head, or leave it out (~/roll-device/outputs/<date>/<time> there)"
        )


def check_checkpointed_roles(config: RunConfig, checkpoint: Path) -> None:
    """The checkpoint a run resumes from holds every role it restores (a PPO run's critic)."""
    roles = config.roles_to_run().present()
    for role, folder in CHECKPOINTED.items():
        if role in roles and not (checkpoint / folder).is_dir():
            raise ConfigError(
                f"resume={config.resume}: {checkpoint} holds no {folder}/ for roles.{role} (the run that "
                f"wrote it had no {role}): resume with roles.{role}=null, or start a new run"
            )


def _saved_section(run_dir: Path, name: str) -> dict | None:
    """Section `name` of the configuration the run in `run_dir` saved (`config.yaml`, as the run
    that wrote its checkpoints had it); None where there is none to read."""
    try:
        section = yaml.safe_load((run_dir / RUN_CONFIG_FILE).read_text())[name]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    return section if isinstance(section, dict) else None


def check_same_trainer(config: RunConfig, run_dir: Path) -> None:
    """The trainer of a resumed run reads the checkpoints its predecessor wrote: the same trainer,
    model-parallel layout and LoRA adapters (or none) as in the run directory's saved `config.yaml`
    (a folder without one, or with a section this version cannot read, is left to the trainer's
    own check)."""
    saved = _saved_section(run_dir, "trainer")
    if saved is None or "name" not in saved:
        return
    try:
        written = (
            read_section(type(config.trainer), saved, "trainer")
            if saved["name"] == config.trainer.name
            else None
        )
    except ConfigError:
        return
    again = "resume with the checkpoints' trainer, or start afresh in another directory (hydra.run.dir=...)"
    if written is None:
        raise ConfigError(
            f"resume={config.resume}: {run_dir}'s checkpoints were written by trainer={saved['name']}, "
            f"which trainer={config.trainer.name} cannot read: {again} (trainer={saved['name']})"
        )
    facets = (
        (written.model_parallel_layout(), config.trainer.model_parallel_layout()),
        (written.adapters_checkpointed(), config.trainer.adapters_checkpointed()),
    )
    for was, now in facets:
        if was != now:
            raise ConfigError(
                f"resume={config.resume}: {run_dir}'s checkpoints were written with {was}, this run has "
                f"{now}: {again}"
            )


def check_same_model(config: RunConfig, model_path: str, run_dir: Path) -> None:
    """A resumed run's model at `model_path` has the shapes of the one its checkpoints were written
    from (the model of the run directory's saved `config.yaml`, where both are on disk: a model
    moved elsewhere resumes)."""
    saved = _saved_section(run_dir, "model")
    saved_path = saved and (saved.get("path") or saved.get("tiny_dir"))
    if not saved_path:
        return
    was, now = model_shape(saved_path), model_shape(model_path)
    if was is None or now is None or was == now:
        return
    differ = ", ".join(
        f"{key} {was.get(key)} -> {now.get(key)}" for key in SHAPE_KEYS if was.get(key) != now.get(key)
    )
    raise ConfigError(
        f"resume={config.resume}: {run_dir}'s checkpoints are of the model at {saved_path}; this run's, at "
        f"{model_path}, differs ({differ}): resume with the overrides that chose that model (experiment=..., "
        "model.path=...), or start afresh in another directory (hydra.run.dir=...)"
    )


def check_model(config: RunConfig, model_path: str, plan: RunPlan | None) -> None:
    """What the model itself must allow with each role's settings, before any worker loads it:
    each strategy's own `check_model` (a Megatron layout the model's heads, vocabulary and layers
    take; a vLLM engine that holds one sequence), told the role's compute platform where it is
    known before the cluster starts (from `plan_here`'s `plan`); with an environment, a chat
    template that renders the turns (and the tools, when asked for); a LoRA policy on a mixture of
    experts, an engine that serves its adapters there."""
    platforms = _compute_platforms_known_here(config, plan)
    for role, spec in config.roles_to_run().present().items():
        settings = config.strategy_settings(role)
        if settings is None:
            continue
        own_path = config.model_path_of(role, model_path)
        strategy_type(ROLE_TYPES[role], spec.strategy).check_model(platforms.get(role), settings, own_path)
    receiver = platforms.get(SYNC_RECEIVER)
    check_expert_adapters(config, receiver, config.model_path_of(SYNC_RECEIVER, model_path))
    if config.agentic.on:  # the chat template renders the turns (and writes the tool calls)
        from roll_device.inputs.loading import load_tokenizer
        from roll_device.pipeline.agentic_step import chat_renderer

        chat_renderer(config, load_tokenizer(model_path))


def check_roles_here(config: RunConfig, plan: RunPlan | None) -> None:
    """On a cluster that is this machine alone (`cluster=local`, no RAY_ADDRESS to join), the
    preflight's checks of each role, in this process before Ray starts: a kind that lacks what a
    role's settings ask (graphs, a sleep level, a package) is refused in seconds, not after Ray's
    start. Other clusters are checked by the preflight on their nodes."""
    if config.cluster.checks_roles_here() and plan is not None:
        check_here(list(plan.requests))


def _compute_platforms_known_here(config: RunConfig, plan: RunPlan | None) -> dict[str, Platform]:
    """Each role's compute platform as planned without Ray: from the nodes the cluster will hold
    (`plan`); on a cluster whose nodes are not known here, only for roles that name their kind."""
    if plan is not None:
        return dict(plan.platforms)
    if config.cluster.plans_before_start:
        return {}
    roles = config.roles_to_run().present()
    return {role: get_platform(spec.device) for role, spec in roles.items() if spec.device != AUTO}
