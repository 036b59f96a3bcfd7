"""Checks of a composed configuration that fail at start, before Ray or any worker starts, with
a message that names the key, the bad value and what to do."""

from __future__ import annotations

from omegaconf import DictConfig

from roll_device.cluster.plan import parse_roles
from roll_device.errors import ConfigError
from roll_device.pipeline.inputs import check_inputs
from roll_device.pipeline.tasks import get_task
from strategies.base import INFERENCE, TRAIN
from strategies.registry import STRATEGIES

REWARD = "reward"  # the role type of reward workers (the pipeline's own, no strategy registry)
ROLE_TYPES = {"actor_infer": INFERENCE, "actor_train": TRAIN, "reference": TRAIN, "reward": REWARD}
REWARD_STRATEGIES = ("rule",)


def validate(cfg: DictConfig) -> None:
    _check_roles(cfg)
    get_task(cfg.data.task)
    check_inputs(cfg)  # data, reward, eval and model directory (roll_device/pipeline/inputs.py)
    _check_sizes(cfg)


def _check_roles(cfg: DictConfig) -> None:
    roles = {name: spec for name, spec in cfg.roles.items() if spec is not None}
    for role in roles:
        if role not in ROLE_TYPES:
            raise ConfigError(
                f"unknown role 'roles.{role}': the roles are {', '.join(ROLE_TYPES)} "
                "(remove it or fix its name)"
            )
    for role in ("actor_infer", "actor_train", "reward"):
        if role not in roles:
            raise ConfigError(f"roles.{role} is missing: the GRPO pipeline needs it")
    parse_roles(cfg.roles)  # kinds, device counts, colocation targets
    names = set(STRATEGIES)
    for role, spec in roles.items():
        role_type = ROLE_TYPES[role]
        if role_type == REWARD:
            if spec.strategy not in REWARD_STRATEGIES:
                raise ConfigError(
                    f"roles.reward.strategy='{spec.strategy}' is unknown: choose {', '.join(REWARD_STRATEGIES)}"
                )
        elif (role_type, spec.strategy) not in names:
            known = sorted(n for (t, n) in names if t == role_type)
            raise ConfigError(
                f"roles.{role}.strategy='{spec.strategy}' is unknown for {role_type}: choose one of "
                f"{', '.join(known)}"
            )


def _check_sizes(cfg: DictConfig) -> None:
    prompts = cfg.data.prompts_per_step
    samples = cfg.algorithm.samples_per_prompt
    if samples < 2:
        raise ConfigError(
            f"algorithm.samples_per_prompt={samples}: GRPO compares samples of one prompt, use 2 or more"
        )
    infer = cfg.roles.actor_infer.num_devices
    if prompts % infer:
        raise ConfigError(
            f"data.prompts_per_step={prompts} does not split across {infer} actor_infer workers: "
            f"make it a multiple of roles.actor_infer.num_devices"
        )
    for role in ("actor_train", "reference"):
        if cfg.roles.get(role) is not None:
            workers = cfg.roles[role].num_devices
            if (prompts * samples) % workers:
                raise ConfigError(
                    f"the batch of {prompts * samples} sequences (data.prompts_per_step x "
                    f"algorithm.samples_per_prompt) does not split across {workers} {role} workers: "
                    f"make it a multiple of roles.{role}.num_devices"
                )
    _check_model_parallel(cfg)
    longest = cfg.data.prompt_length + 1 + cfg.algorithm.max_new_tokens
    if longest > cfg.rollout.max_model_len:
        raise ConfigError(
            f"prompt ({cfg.data.prompt_length + 1}) + algorithm.max_new_tokens "
            f"({cfg.algorithm.max_new_tokens}) exceeds rollout.max_model_len ({cfg.rollout.max_model_len})"
        )
    if cfg.algorithm.kl_coef > 0 and cfg.roles.get("reference") is None:
        raise ConfigError(
            f"algorithm.kl_coef={cfg.algorithm.kl_coef} needs reference logprobs: configure "
            "roles.reference, or set algorithm.kl_coef=0"
        )
    if cfg.max_steps < 1:
        raise ConfigError(f"max_steps={cfg.max_steps}: a run needs at least one step")


def _check_model_parallel(cfg: DictConfig) -> None:
    """Trainer roles run whole model replicas: tensor x pipeline parallel ranks each (the
    reference only when it runs, with algorithm.kl_coef > 0)."""
    tp, pp = cfg.trainer.get("tensor_parallel", 1), cfg.trainer.get("pipeline_parallel", 1)
    roles = ("actor_train", "reference") if cfg.algorithm.kl_coef > 0 else ("actor_train",)
    for role in roles:
        if cfg.roles.get(role) is not None and cfg.roles[role].num_devices % (tp * pp):
            raise ConfigError(
                f"roles.{role}.num_devices={cfg.roles[role].num_devices} is not a multiple of "
                f"trainer.tensor_parallel x trainer.pipeline_parallel = {tp} x {pp}: every model replica "
                "needs that many workers"
            )
