"""MindSpeed glue checks in fresh processes on the simulated NPU, its kernels taken as a real NPU's
(`_npu_trainer`), with the STAND-IN mindspeed package of tests/compat/standin (which records calls
and patches nothing)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.configs import trainer_settings
from tests.isolated import error_of, simulated_npu

STANDIN = str(Path(__file__).parent / "standin")


def _npu_trainer():
    from strategies.registry import strategy_class

    platform = simulated_npu()
    # STAND-IN for a real NPU's kernels: the simulation's own are the host's (Platform.kernels_kind),
    # on which megatron runs through the CUDA redirects and MindSpeed is not applied; taken as the
    # NPU's here (this process only), the trainer takes a real NPU's path, the one under test
    type(platform).kernels_kind = property(lambda self: self.kind)
    return strategy_class("train", "megatron", platform.kind)(platform)


def order_and_options(model_path: str) -> dict:
    """The trainer applies the stand-in before megatron is imported and passes its options."""
    sys.path.insert(0, STANDIN)
    os.environ["MINDSPEED_STANDIN_STOP"] = "1"
    trainer = _npu_trainer()
    settings = trainer_settings("megatron", tensor_parallel=2, mindspeed={"use_fused_rmsnorm": True})
    error = error_of(lambda: trainer.initialize(model_path, settings))
    import mindspeed

    from roll_device.compat import mindspeed as glue

    os.environ.pop("MINDSPEED_STANDIN_STOP")
    glue.apply({"second": True})
    return {
        "error": error,
        "events": [list(e) for e in mindspeed.EVENTS],
        "stand_in_file": mindspeed.__file__,
    }


def missing_then_too_late(model_path: str) -> dict:
    """Without MindSpeed: the error names it. With megatron imported first: refused."""
    out = {"missing": error_of(lambda: _npu_trainer().initialize(model_path, trainer_settings("megatron")))}
    import megatron.core  # noqa: F401  (imported first on purpose)

    from roll_device.compat import mindspeed as glue

    sys.path.insert(0, STANDIN)
    out["too_late"] = error_of(lambda: glue.apply({}))
    return out
