"""`roll-device run [overrides] [Hydra flags]`: the experiment as a Hydra app (`@hydra.main`:
output directory, saved config, `--help`, `--cfg job`, `--info`, `-m`/`--multirun`, `-c`), then the
run in it.

Overrides are composed and checked here first when no Hydra flag is given, so that a bad override
is refused as any bad input is (one line, exit 2) instead of by Hydra's own report (exit 1), and a
resumed run's checkpoint is checked before Hydra writes into its run directory.
Exit status: 0 on success; else the `exit_code` of the `RollDeviceError` that ended the run (2 bad
input, 1 a lost worker, 130 Ctrl-C), its message one line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from roll_device.config import CONFIG_NAME, compose, config_dir
from roll_device.errors import RollDeviceError


def _check(args: list[str]):
    from omegaconf import open_dict

    from roll_device.pipeline.experiment import check_before_start

    cfg = compose(args, with_hydra=True)
    run_dir = Path(cfg.hydra.run.dir)
    with open_dict(cfg):
        del cfg["hydra"]
    return check_before_start(cfg, run_dir)


def run_command(args: list[str]) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    checked = None if any(arg.startswith("-") for arg in args) else _check(args)
    outcome = {"code": 0}

    @hydra.main(config_path=str(config_dir()), config_name=CONFIG_NAME, version_base="1.3")
    def _main(cfg) -> None:
        from roll_device.pipeline.experiment import run_experiment

        try:
            run_experiment(cfg, Path(HydraConfig.get().runtime.output_dir), checked=checked)
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
