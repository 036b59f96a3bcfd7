"""A Megatron trainer step on the CPU with the CUDA redirect switched off (fresh process)."""

from __future__ import annotations

import contextlib


def without_redirect(model_path: str) -> dict:
    from roll_device.compat import megatron as megatron_compat

    megatron_compat.ADAPTERS["cpu"] = lambda platform, options: contextlib.nullcontext
    import roll_device as rd
    from strategies.training.megatron import MegatronTrainStrategy
    from tests.configs import trainer_settings

    try:
        MegatronTrainStrategy(rd.get_platform("cpu")).initialize(model_path, trainer_settings("megatron"))
    except Exception as exc:  # noqa: BLE001 (the tests assert on the type name and message)
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": ""}
