"""`roll-device run [overrides] [Hydra flags]`: the experiment, configured by Hydra.

Without Hydra flags the overrides are composed once (with Hydra's run node: the run directory),
read into the typed configuration and checked (roll_device/commands/gate.py) before anything
starts or is written: a bad override is refused in one line (exit 2) instead of Hydra's report,
and a resumed run's checkpoint is checked before the run directory is touched. The run directory
then gets what Hydra's own job runner writes (`.hydra/config.yaml`, `hydra.yaml`,
`overrides.yaml`), and the run starts.

With a Hydra flag (`--help`, `--cfg job`, `--info`, `-m`/`--multirun`, `-c`, `--resolve`) the
command is Hydra's app (`@hydra.main`): Hydra composes and prints or sweeps, and each job it runs
is read, checked and run the same way. Each job's overrides (every value of a sweep) are composed
first, so that an unknown key or option is the same one line (exit 2) as without a flag.

Exit status: 0 on success; else the `exit_code` of the `RollDeviceError` that ended the run (2 bad
input, 1 a lost worker, 130 Ctrl-C, 143 SIGTERM), its message one line on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from roll_device.commands.compose import CONFIG_NAME, compose, config_dir, explain
from roll_device.commands.gate import (
    check_before_start,
    check_model,
    check_same_model,
    check_simulation,
    read_config,
)
from roll_device.errors import ConfigError, RollDeviceError
from roll_device.pipeline.config import RunConfig
from roll_device.pipeline.experiment import model_path, run_experiment
from roll_device.pipeline.run_plan import plan_here

HYDRA_OUTPUT = ".hydra"


def run_checked(
    config: RunConfig,
    run_dir: Path,
    on_step: Callable | None = None,
    after_checks: Callable[[], None] | None = None,
) -> Path:
    """Check `config` for this machine (then `after_checks()`), and run it with outputs in
    `run_dir`: the model is made when it is the tiny one, and checked against each role's
    settings. Returns the run directory."""
    check_simulation(config, "run")
    plan = plan_here(config)
    start = check_before_start(config, run_dir, plan)
    if after_checks is not None:
        after_checks()
    if config.roles_to_run() != config.roles:
        print("reference: not started (algorithm.kl_coef=0 needs no reference logprobs)")
    model = model_path(config.model)
    if start is not None:
        check_same_model(config, model, run_dir)
    check_model(config, model, plan)
    return run_experiment(config, run_dir, model, start, on_step)


def save_hydra_files(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> None:
    """What Hydra's job runner saves in a run directory: the job's config, Hydra's, the overrides."""
    folder = run_dir / HYDRA_OUTPUT
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]), folder / "config.yaml")
    OmegaConf.save(OmegaConf.masked_copy(cfg, ["hydra"]), folder / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), folder / "overrides.yaml")


def compose_each_job(overrides: list[str]) -> None:
    """Compose every job `overrides` sweep over (each value of a sweep once, the others at their
    first), or the ConfigError of the first that does not compose."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError(explain(exc)) from None
    values = [list(o.sweep_string_iterator()) if o.is_sweep_override() else [None] for o in parsed]
    line = [o.input_line if v == [None] else f"{o.get_key_element()}={v[0]}" for o, v in zip(parsed, values)]
    compose(line)
    for index, (override, options) in enumerate(zip(parsed, values)):
        for value in options[1:]:
            compose([*line[:index], f"{override.get_key_element()}={value}", *line[index + 1 :]])


def run_command(args: list[str]) -> int:
    if any(arg.startswith("-") for arg in args):
        compose_each_job(
            [arg for arg in args if not arg.startswith("-") and ("=" in arg or arg.startswith("~"))]
        )
        return _hydra_app(args)
    cfg = compose(args, with_hydra=True)
    run_dir = Path(cfg.hydra.run.dir)
    run_checked(read_config(cfg), run_dir, after_checks=lambda: save_hydra_files(cfg, run_dir, args))
    return 0


def _hydra_app(args: list[str]) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    outcome = {"code": 0}

    @hydra.main(config_path=str(config_dir()), config_name=CONFIG_NAME, version_base="1.3")
    def _main(cfg) -> None:
        try:
            run_checked(read_config(cfg), Path(HydraConfig.get().runtime.output_dir))
        except RollDeviceError as exc:
            print(f"roll-device run: error: {exc}", file=sys.stderr)
            outcome["code"] = max(outcome["code"], exc.exit_code)

    saved_argv = sys.argv
    sys.argv = ["roll-device run", *args]
    try:
        _main()
    except SystemExit as exit_:  # Hydra's own flags (--help) and reports end this way
        return exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = saved_argv
    return outcome["code"]
