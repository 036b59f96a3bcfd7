"""`roll-device run [overrides]`: compose the Hydra config as `@hydra.main` does (output
directory, saved config, command-line overrides), then run the experiment in it.

Exit status: 0 on success; 2 with a one-line message for bad input, a plan that does not fit,
a missing package, or a lost worker (the message says how to resume).
"""

from __future__ import annotations

import sys
from pathlib import Path

from roll_device.config import CONFIG_NAME, config_dir
from roll_device.errors import RollDeviceError


def run_command(overrides: list[str]) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    outcome = {"code": 0}

    @hydra.main(config_path=str(config_dir()), config_name=CONFIG_NAME, version_base="1.3")
    def _main(cfg) -> None:
        from roll_device.pipeline.experiment import run_experiment

        try:
            run_experiment(cfg, Path(HydraConfig.get().runtime.output_dir))
        except RollDeviceError as exc:
            print(f"roll-device run: error: {exc}", file=sys.stderr)
            outcome["code"] = 2

    saved_argv = sys.argv
    sys.argv = ["roll-device", *overrides]
    try:
        _main()
    finally:
        sys.argv = saved_argv
    return outcome["code"]
