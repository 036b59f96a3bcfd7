"""The one check of a composed configuration, run before Ray or any worker starts: the schema of
every section (types, ranges, choices: schema.py), then what crosses sections (known roles and
strategies, batch splits, model-parallel layouts, context length); and `check_model`, once the
model is on disk: what it allows with each role's settings, as each strategy checks it. Each
failure is one `ConfigError` line that names the key, the bad value and what to do."""

from __future__ import annotations

from omegaconf import DictConfig

from roll_device.cluster.launcher import setting
from roll_device.cluster.plan import AUTO, parse_roles
from roll_device.errors import ConfigError, PlanError
from roll_device.pipeline.inputs import check_inputs
from roll_device.pipeline.role_settings import STRATEGY_TYPES, compute_platform, strategy_settings
from roll_device.pipeline.schema import REWARD, ROLE_TYPES, check_schema
from roll_device.pipeline.tasks import get_task
from roll_device.platforms import Platform, get_platform
from strategies.registry import STRATEGIES

REWARD_STRATEGIES = ("rule",)


def validate(cfg: DictConfig) -> None:
    check_schema(cfg)
    _check_roles(cfg)
    get_task(cfg.data.task)
    check_inputs(cfg)  # data, reward, eval and model directory (roll_device/pipeline/inputs.py)
    _check_sizes(cfg)


def _check_roles(cfg: DictConfig) -> None:
    roles = {name: spec for name, spec in cfg.roles.items() if spec is not None}  # names: schema
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


def check_model(cfg: DictConfig, model_path: str) -> None:
    """What the model itself must allow with each role's settings, before any worker loads it:
    each strategy's own `check_model` (a Megatron layout the model's heads, vocabulary and layers
    take; a vLLM engine that holds one sequence), told the role's compute platform where it is
    known before the cluster starts."""
    platforms = _compute_platforms_known_here(cfg)
    for role, spec in cfg.roles.items():
        if spec is None or ROLE_TYPES[role] not in STRATEGY_TYPES:
            continue
        cls = STRATEGIES[(ROLE_TYPES[role], spec.strategy)]
        settings = strategy_settings(cfg, role, rollout_colocated=False)  # no model check asks it
        cls.check_model(platforms.get(role), settings, model_path)


def _compute_platforms_known_here(cfg: DictConfig) -> dict[str, Platform]:
    """Each role's compute platform as planned without Ray: on a local or simulated cluster from
    the nodes it will hold; on a remote one only for roles that name their device kind."""
    from roll_device.cluster.commands import inventory_here, plan_from_config

    if setting(cfg.cluster, "name") != "remote":
        try:
            plan = plan_from_config(cfg, inventory_here(cfg.cluster))
        except PlanError:
            return {}  # refused with the cluster's own inventory once it runs
        return {role: compute_platform(plan, role) for role in plan.roles}
    specs = parse_roles(cfg.roles)  # each role's device as the plan will read it
    return {role: get_platform(spec.device) for role, spec in specs.items() if spec.device != AUTO}
