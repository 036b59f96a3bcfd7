"""The step plan: one line that `roll-device plan` and `roll-device run` print before the device
plan, with what a step does with its batch: its sequences, its optimizer steps (`ppo_epochs` passes
of `mini_batches`: pipeline/updates.py) and the learning rate's schedule over the run (the
trainer's `lr_factor`), so a recipe's shape is seen before a job starts."""

from __future__ import annotations

from roll_device.pipeline.config import RunConfig


def step_plan(config: RunConfig) -> str:
    """`config`'s step plan, one line."""
    algo, prompts = config.algorithm, config.data.prompts_per_step
    updates = algo.ppo_epochs * algo.mini_batches
    batch = f"{prompts} prompts x {algo.samples_per_prompt} samples = {prompts * algo.samples_per_prompt} sequences"
    if algo.max_sampling_rounds > 1:
        batch += f" (dynamic sampling: up to {algo.max_sampling_rounds} rounds)"
    steps = (
        f"{algo.ppo_epochs} pass{'es' if algo.ppo_epochs > 1 else ''} x {algo.mini_batches} "
        f"mini-batch{'es' if algo.mini_batches > 1 else ''} = {updates} optimizer step{'s' if updates > 1 else ''}"
    )
    line = f"step plan: {algo.name}, {batch}; {steps} a step; {learning_rate(config, 'actor_train')}"
    if config.roles.critic is not None:
        line += f"; critic {learning_rate(config, 'critic')}"
    return line


def learning_rate(config: RunConfig, role: str) -> str:
    """`role`'s learning rate and its schedule over the run's optimizer steps."""
    settings = config.strategy_settings(role)
    text = f"lr {settings.lr:g}"
    if settings.warmup_steps:
        text += f", {settings.warmup_steps} warmup steps"
    if settings.lr_schedule == "constant":
        return f"{text}, constant"
    floor = settings.lr * settings.min_lr_ratio
    return f"{text}, cosine to {floor:g} over {settings.schedule_steps} optimizer steps"
