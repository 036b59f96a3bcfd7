"""Run one experiment: check the config, make the model if needed, connect the cluster, plan and
start the roles, run GRPO steps with a progress bar, checkpoint, and write metrics and a plot.

`run_experiment(cfg, run_dir, on_step=None)`: `on_step(record, roles)` is called after each step
(for custom logging or fault drills). A lost worker ends the run with a `WorkerLostError` that
says which checkpoint to resume from; a rollout or reward worker lost after a completed step gets
that step checkpointed first, so nothing is lost. A user reward function that raises ends the run
the same way (`RewardFunctionError`, with the offending sample), after the finished steps are
checkpointed. With `eval.every_n_steps` set, greedy pass@1 on the held-out prompts is measured
before the first step, every N steps and after the last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from roll_device.cluster import plan_from_config, start_cluster
from roll_device.cluster.placement import release
from roll_device.doctor.preflight import preflight
from roll_device.errors import ConfigError
from roll_device.models.hf_dir import check_model_dir
from roll_device.pipeline.evaluation import evaluate
from roll_device.pipeline.inputs import RunInputs, load_inputs
from roll_device.pipeline.loop import GrpoStep
from roll_device.pipeline.metrics import PASS_KEY, MetricsLog
from roll_device.pipeline.output import LOG_DIR, quiet_driver, summarise_worker_logs
from roll_device.pipeline.rewards import RewardFunctionError
from roll_device.pipeline.role_settings import role_requests
from roll_device.pipeline.roles import RoleGroups, WorkerLostError, start_roles
from roll_device.pipeline.state import Checkpoints, PipelineState
from roll_device.pipeline.validate import validate

POLICY_DIR = "policy"


def model_path(cfg: DictConfig) -> str:
    """`model.path` once checked (config, architecture, tokenizer), or the tiny model made locally."""
    if cfg.model.path:
        check_model_dir(cfg.model.path)
        return str(cfg.model.path)
    from roll_device.models.tiny import make_tiny_model

    return str(
        make_tiny_model(
            cfg.model.tiny_dir, num_layers=cfg.model.tiny_layers, hidden_size=cfg.model.tiny_hidden
        )
    )


def _drop_unused_reference(cfg: DictConfig) -> None:
    if cfg.algorithm.kl_coef == 0 and cfg.roles.get("reference") is not None:
        with open_dict(cfg):
            del cfg.roles["reference"]
        print("reference: not started (algorithm.kl_coef=0 needs no reference logprobs)")


class Run:
    """The state of one run: checkpoints, metrics, and the roles it drives."""

    def __init__(self, cfg: DictConfig, run_dir: Path, roles: RoleGroups, inputs: RunInputs) -> None:
        self.cfg, self.run_dir, self.roles, self.inputs = cfg, run_dir, roles, inputs
        self.checkpoints = Checkpoints(run_dir)
        self.metrics = MetricsLog(run_dir)
        self.step = GrpoStep(cfg, roles, inputs)
        self.state = PipelineState()
        self.saved_step = 0
        self.last_step = inputs.last_step

    def restore(self) -> None:
        latest = self.checkpoints.latest()
        if latest is None:
            raise ConfigError(
                f"resume=true but {self.checkpoints.root} holds no checkpoint: pass the run's "
                "directory with hydra.run.dir=<dir> (the folder that has checkpoints/)"
            )
        path, self.state = latest
        self.saved_step = self.state.step
        self.roles.call("actor_train", "load", str(path / POLICY_DIR))
        self.metrics.truncate_after(self.state.step)
        self.roles.sync_weights(version=self.state.step)
        print(f"resumed from {path} at step {self.state.step}")

    def save(self) -> Path:
        staging = self.checkpoints.staging_dir(self.state.step)
        self.roles.call("actor_train", "save", str(staging / POLICY_DIR))
        self.saved_step = self.state.step
        return self.checkpoints.commit(staging, self.state)

    def due(self) -> bool:
        every = self.cfg.save_every
        return self.state.step == self.last_step or (every > 0 and self.state.step % every == 0)

    def evaluate(self) -> dict:
        record = evaluate(self.step, self.inputs.eval_samples, self.inputs.evaluation, self.state.step)
        self.metrics.append(record)
        return record

    def loop(self, on_step: Callable | None) -> None:
        from tqdm import tqdm

        if self.inputs.evaluation.enabled and self.state.step == 0:
            self.evaluate()
        bar = tqdm(total=self.last_step, initial=self.state.step, desc="grpo", unit="step")
        try:
            while self.state.step < self.last_step:
                record = self.step.run(self.state)
                self.metrics.append(record)
                bar.update(1)
                postfix = {"reward": f"{record['reward_mean']:.3f}"}
                if self.inputs.evaluation.due(self.state.step, self.last_step):
                    postfix["pass@1"] = f"{self.evaluate()[PASS_KEY]:.3f}"
                postfix.update({k: f"{record[k + '_s']:.2f}s" for k in ("rollout", "train", "sync")})
                bar.set_postfix(postfix)
                if self.due():
                    self.save()
                if on_step is not None:
                    on_step(record, self.roles)
        finally:
            bar.close()

    def keep_finished_steps(self, trainer_alive: bool = True) -> str:
        """Checkpoint the steps done since the last checkpoint (when the trainer can still save);
        returns how to resume."""
        if trainer_alive and self.state.step > self.saved_step:
            try:
                self.save()
            except WorkerLostError:
                pass
        latest = self.checkpoints.latest()
        where = (
            f"the last checkpoint is step {latest[1].step} in {latest[0]}"
            if latest
            else "no checkpoint was written yet"
        )
        return (
            f"the run stopped after step {self.state.step}; {where}; continue with: roll-device run "
            f"resume=true hydra.run.dir={self.run_dir} (and the same overrides)"
        )

    def fail(self, error: WorkerLostError) -> WorkerLostError:
        """Checkpoint what can be kept, and say how to resume."""
        advice = self.keep_finished_steps(trainer_alive=error.role != "actor_train")
        return WorkerLostError(error.role, error.cause, advice=advice)

    def reward_failed(self, error: RewardFunctionError) -> RewardFunctionError:
        """The reward function's one-line report (not Ray's wrapped traceback) and how to resume."""
        cause = getattr(error, "cause", None) or error
        return RewardFunctionError(f"{str(cause).splitlines()[0]}; {self.keep_finished_steps()}")


def run_experiment(cfg: DictConfig, run_dir: Path, on_step: Callable | None = None) -> Path:
    """Run `cfg` with outputs in `run_dir`; returns the run directory."""
    from transformers import AutoTokenizer

    quiet_driver()
    validate(cfg)
    _drop_unused_reference(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    path = model_path(cfg)
    inputs = load_inputs(cfg, AutoTokenizer.from_pretrained(path), path)
    started = time.perf_counter()
    with start_cluster(cfg.cluster):
        plan = plan_from_config(cfg)
        print(
            f"cluster ready in {time.perf_counter() - started:.1f}s; device plan:\n{plan.format()}",
            flush=True,
        )
        checking = time.perf_counter()
        nodes = preflight(plan, role_requests(cfg, plan))
        print(
            f"preflight: {nodes} node(s) ready for their roles ({time.perf_counter() - checking:.1f}s)",
            flush=True,
        )
        roles = start_roles(cfg, plan, path, inputs.reward, log_dir=run_dir / LOG_DIR)
        try:
            print(
                f"workers ready in {time.perf_counter() - started:.1f}s; weight sync: {roles.sync.describe()}",
                flush=True,
            )
            run = Run(cfg, run_dir, roles, inputs)
            if cfg.resume:
                run.restore()
            try:
                run.loop(on_step)
            except WorkerLostError as lost:
                raise run.fail(lost) from lost
            except RewardFunctionError as failed:
                raise run.reward_failed(failed) from None
            png = run.metrics.plot(f"{cfg.experiment.name}: GRPO, {data_summary(cfg)} ({plan_summary(plan)})")
            print(f"{run.metrics.summary()}; plot: {png}")
        finally:
            roles.shutdown()
            release(plan)
            print(summarise_worker_logs(run_dir / LOG_DIR), flush=True)
    print(f"run directory: {run_dir} (metrics.jsonl, metrics.png, checkpoints/)")
    return run_dir


def data_summary(cfg: DictConfig) -> str:
    if cfg.data.get("path"):
        return f"{Path(cfg.data.path).name}, reward {cfg.reward.function}"
    return f"task '{cfg.data.task}'"


def plan_summary(plan) -> str:
    return ", ".join(
        f"{role} on {p.kind}" + (" (simulated)" if p.simulated else "") for role, p in plan.roles.items()
    )
