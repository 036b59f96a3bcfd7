"""`roll-device`: run an experiment, print its device plan, submit it to a Ray cluster, check what
this machine can run (doctor), export a checkpoint as a Hugging Face model, or make the tiny local model. Overrides are Hydra's (`key=value`, `group=option`).

`run` is a Hydra app: everything after `run` goes to Hydra, its own flags included (`--help`,
`--cfg job`, `--info`, `-m`/`--multirun`, `-c`). One exit-code rule on every subcommand: 0 done,
2 bad input (one line on stderr, before work starts: a bad override, value, plan or missing
package), 1 a run that failed on the way (a lost worker), 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM, handled as Ctrl-C is: the run saves its last finished step and says how to resume).
"""

from __future__ import annotations

import argparse
import os
import sys

from roll_device.commands.models import QWEN_SHAPES, SHAPES, TINY_SHAPES
from roll_device.errors import RollDeviceError
from roll_device.pipeline.interrupts import how_stopped, sigterm_as_interrupt
from roll_device.platforms import ENV_VAR
from roll_device.sim.settings import check_all as check_simulation_settings

SUBMITTABLE = ("run", "plan")  # what a submitted job may run


def _run(args: list[str]) -> int:
    from roll_device.commands.run import run_command

    return run_command(args)


def _plan(args: argparse.Namespace) -> int:
    from roll_device.commands.plan import plan_command

    return plan_command(args.overrides)


def _submit(args: argparse.Namespace) -> int:
    from roll_device.commands.submit import submit_command

    return submit_command(args.overrides, address=args.address, no_wait=args.no_wait, command=args.job)


def _doctor(args: argparse.Namespace) -> int:
    from roll_device.commands.doctor import doctor_command

    return doctor_command(args.overrides)


def _make_tiny_model(args: argparse.Namespace) -> int:
    from roll_device.commands.models import make_model_command

    return make_model_command(args.path, args.shapes, args.seed, args.layers, args.hidden)


def _export(args: argparse.Namespace) -> int:
    from roll_device.commands.export import export_command

    return export_command(args.source, args.out_dir, args.model, args.overwrite, args.merge)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand; `run` parses none of its arguments (`main` hands them to Hydra)."""
    parser = argparse.ArgumentParser(
        prog="roll-device",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="subcommand", required=True)

    sub.add_parser(
        "run",
        help="run an experiment (default: tiny GRPO on this machine); Hydra app: "
        "`roll-device run --help` lists its flags (--cfg job, --info, -m, -c)",
    )

    plan = sub.add_parser("plan", help="print the device map; exit 2 when it does not fit")
    plan.add_argument("overrides", nargs="*")
    plan.set_defaults(func=_plan)

    _add_submit(sub)

    doctor = sub.add_parser(
        "doctor", help="versions, device capabilities and known-bad combinations; exit 2 on a problem"
    )
    doctor.add_argument("overrides", nargs="*", help="Hydra overrides of the experiment to check")
    doctor.set_defaults(func=_doctor)

    _add_export(sub)
    _add_make_tiny_model(sub)
    return parser


def _add_submit(sub) -> None:
    """`submit [--address A] [--no-wait] [--command run|plan] overrides...`."""
    submit = sub.add_parser("submit", help="submit the run to a Ray cluster (Ray Jobs API)")
    submit.add_argument("--address", default=None, help="dashboard address, e.g. http://127.0.0.1:8265")
    submit.add_argument("--no-wait", action="store_true", help="return after submission")
    submit.add_argument(
        "--command",
        dest="job",
        choices=SUBMITTABLE,
        default="run",
        help="what the job runs: the experiment (default) or only its device plan",
    )
    submit.add_argument("overrides", nargs="*")
    submit.set_defaults(func=_submit)


def _add_export(sub) -> None:
    """`export source out_dir [--model M] [--overwrite] [--merge]`."""
    export = sub.add_parser(
        "export", help="write a Hugging Face model directory from a checkpoint of either trainer"
    )
    export.add_argument("source", help="a run directory, a checkpoints/step_<N> folder or its policy/")
    export.add_argument("out_dir")
    export.add_argument("--model", default=None, help="the model the run trained (default: the run's model)")
    export.add_argument(
        "--overwrite", action="store_true", help="write into an OUT_DIR that already holds files"
    )
    export.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA checkpoint: the model with its adapters merged (default: the adapter, PEFT's format)",
    )
    export.set_defaults(func=_export)


def _add_make_tiny_model(sub) -> None:
    """`make-tiny-model path [--shapes S] [--seed N] [--layers N] [--hidden N]`."""
    tiny = sub.add_parser("make-tiny-model", help="write the tiny Qwen2 model and tokenizer")
    tiny.add_argument("path")
    tiny.add_argument(
        "--shapes",
        choices=SHAPES,
        default=TINY_SHAPES,
        help=f"{TINY_SHAPES} (default, Qwen2), tiny-qwen3, tiny-qwen3-moe, or {' or '.join(QWEN_SHAPES)}'s "
        "shapes (random weights, for measurements at size)",
    )
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--layers",
        type=int,
        default=None,
        help="decoder layers (tiny: 2, qwen3-30b-a3b: 2, the others: the model's own)",
    )
    tiny.add_argument("--hidden", type=int, default=None, help="hidden size of the tiny shapes (128)")
    tiny.set_defaults(func=_make_tiny_model)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:  # the rest is Hydra's, flags included
        return _guarded("run", lambda: _run(argv[1:]))
    args = build_parser().parse_args(argv)
    return _guarded(args.subcommand, lambda: args.func(args))


def _guarded(subcommand: str, command) -> int:
    """`command()`'s exit status; a RollDeviceError as one line on stderr and its exit code.
    SIGTERM is handled as Ctrl-C is (roll_device/pipeline/interrupts.py)."""
    try:
        with sigterm_as_interrupt():
            if os.environ.get(ENV_VAR):  # a bad ROLL_DEVICE is refused before any work
                from roll_device.platforms.registry import current_platform

                current_platform()
            check_simulation_settings()  # as a bad ROLL_SIM_* value, which workers would read later
            return int(command() or 0)
    except RollDeviceError as exc:
        print(f"roll-device {subcommand}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as stop:  # before or after a run's own handling (which says how to resume)
        error, what = how_stopped(stop)
        print(f"roll-device {subcommand}: {what}", file=sys.stderr)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
