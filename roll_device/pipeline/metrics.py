"""Per-step metrics of a run: appended to `metrics.jsonl` and drawn as `metrics.png` (reward and
evaluation pass@1, KL to the reference when one runs, the critic's value loss when one trains, the
turns and tool calls of multi-turn rollouts, step time and its parts; steps ticked as whole numbers)
in the run directory.

Training steps and evaluations are lines of their own: an evaluation line has `eval_pass@1` and
no `reward_mean` (see `roll_device.pipeline.evaluation`)."""

from __future__ import annotations

from pathlib import Path

from roll_device.agentic.trajectory import TOOL_CALLS, TOOL_FAILURES, TURNS
from roll_device.pipeline.jsonlines import JsonLines

PLOTTED_TIMES = ("rollout_s", "train_s", "sync_s")
PASS_KEY = "eval_pass@1"
CRITIC_LOSS, CRITIC_EXPLAINED = "critic_value_loss", "critic_vf_explained_var"  # critic_step.py's keys


class MetricsLog(JsonLines):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(Path(run_dir) / "metrics.jsonl")
        self.png = Path(run_dir) / "metrics.png"

    def steps(self) -> list[dict]:
        """The training steps' records."""
        return [r for r in self.read() if "reward_mean" in r]

    def evaluations(self) -> list[dict]:
        return [r for r in self.read() if PASS_KEY in r]

    def summary(self) -> str:
        steps, evals = self.steps(), self.evaluations()
        text = (
            f"mean reward: step {steps[0]['step']} {steps[0]['reward_mean']:.3f} -> "
            f"step {steps[-1]['step']} {steps[-1]['reward_mean']:.3f}"
        )
        if evals:
            text += (
                f"; eval pass@1: step {evals[0]['step']} {evals[0][PASS_KEY]:.3f} -> "
                f"step {evals[-1]['step']} {evals[-1][PASS_KEY]:.3f}"
            )
        return text

    def plot(self, title: str, with_kl: bool) -> Path:
        """`metrics.png`: the figure `figure` draws."""
        import matplotlib.pyplot as plt

        fig = self.figure(title, with_kl)
        fig.savefig(self.png, dpi=100)
        plt.close(fig)
        return self.png

    def figure(self, title: str, with_kl: bool):
        """Reward (and eval pass@1); KL to the reference where one runs (`with_kl`; without one its
        KL is no measurement, so the panel is left out); the critic's value loss and explained
        variance where a critic trained; the turns and tool calls of multi-turn rollouts; seconds
        per step; whole-number step ticks."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        records, evals = self.steps(), self.evaluations()
        panels = [lambda ax: _reward_panel(ax, records, evals)]
        if with_kl:
            panels.append(lambda ax: _kl_panel(ax, records))
        if any(CRITIC_LOSS in r for r in records):
            panels.append(lambda ax: _critic_panel(ax, records))
        if any(TURNS in r for r in records):
            panels.append(lambda ax: _turns_panel(ax, records))
        panels.append(lambda ax: _seconds_panel(ax, records))
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels) + 2, 4))
        for ax, draw in zip(axes, panels, strict=True):
            draw(ax)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(title)
        fig.tight_layout()
        return fig


def _steps(records: list[dict]) -> list[int]:
    return [r["step"] for r in records]


def _reward_panel(ax, records: list[dict], evals: list[dict]) -> None:
    ax.plot(_steps(records), [r["reward_mean"] for r in records], marker="o", label="mean reward")
    if evals:
        ax.plot(_steps(evals), [r[PASS_KEY] for r in evals], marker="s", label="eval pass@1")
        ax.legend()
    ax.set(title="reward" + (" and eval pass@1" if evals else ""), xlabel="step")


def _kl_panel(ax, records: list[dict]) -> None:
    ax.plot(_steps(records), [r.get("kl", 0.0) for r in records], marker="o", color="tab:purple")
    ax.set(title="KL to reference", xlabel="step")


def _critic_panel(ax, records: list[dict]) -> None:
    """The critic's value loss, and on a second axis how much of the returns' variance its values
    explained (1: all)."""
    trained = [r for r in records if CRITIC_LOSS in r]
    ax.plot(_steps(trained), [r[CRITIC_LOSS] for r in trained], marker="o", color="tab:red")
    ax.set(title="critic", xlabel="step")
    ax.set_ylabel("value loss", color="tab:red")
    explained = ax.twinx()
    explained.plot(_steps(trained), [r.get(CRITIC_EXPLAINED, 0.0) for r in trained], color="tab:green")
    explained.set_ylabel("explained variance", color="tab:green")


def _turns_panel(ax, records: list[dict]) -> None:
    """Turns per trajectory of multi-turn rollouts, and on a second axis the step's tool calls and
    the failed ones where tools were called."""
    rolled = [r for r in records if TURNS in r]
    ax.plot(_steps(rolled), [r[TURNS] for r in rolled], marker="o", color="tab:blue")
    ax.set(title="multi-turn", xlabel="step")
    ax.set_ylabel("turns per trajectory", color="tab:blue")
    if any(r.get(TOOL_CALLS) for r in rolled):
        calls = ax.twinx()
        calls.plot(_steps(rolled), [r[TOOL_CALLS] for r in rolled], color="tab:orange", label="tool calls")
        calls.plot(_steps(rolled), [r[TOOL_FAILURES] for r in rolled], color="tab:red", label="failed")
        calls.set_ylabel("tool calls per step")
        calls.legend(loc="upper right")


def _seconds_panel(ax, records: list[dict]) -> None:
    ax.plot(_steps(records), [r["step_s"] for r in records], marker="o", color="black", label="step")
    for key in PLOTTED_TIMES:
        ax.plot(_steps(records), [r.get(key, 0.0) for r in records], label=key.removesuffix("_s"))
    ax.set(title="seconds per step", xlabel="step")
    ax.legend()
