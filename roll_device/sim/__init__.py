"""Simulated Ascend NPU for machines without one (`ROLL_DEVICE=npu-sim`).

`install()` renames PrivateUse1 to `npu` with a Python backend, gives it a device guard that
reports the simulated machine's devices (`device_guard.py`), registers a `torch.npu`-like module, routes every op on `npu` tensors to the CPU (a simulated tensor's storage is the storage of
the CPU data it wraps, so FSDP2 frees and regrows real memory), and registers an `hccl`
process-group backend that runs gloo underneath. The NPU platform class then runs on it
unmodified: the simulation stands in for torch_npu, never for the platform code.

It fails where the device fails: ACL graphs capture and replay (`graphs.py`) and refuse what needs
the host during capture; a capture needs one of the device's streams (`streams.py`); memory has a
capacity past which allocation raises torch_npu's out-of-memory error, and graph pools are shared
(`memory.py`). The errors carry torch_npu's wording (`errors.py`).

Its settings are `ROLL_SIM_*` environment variables, checked where they are read (`settings.py`).

What it does not model: NPU kernels and their numerics (ops run on CPU kernels), HCCL itself
(collectives are gloo on CPU tensors), timing and asynchrony (every op completes before it
returns), and the allocator's caching and fragmentation. Every result obtained through it is a
simulation and must be labelled so.

Simulated tensors are a subclass of `torch.Tensor`; `ray_pickling.py` lets Ray's tensor hooks
(Compiled Graph channels, Ray Direct Transport) catch them as they catch a real `npu` tensor.

The rename is once per process and cannot be undone: tests that install it run in their own process.
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()
_installed = {"done": False}


def is_installed() -> bool:
    return _installed["done"]


def install() -> None:
    """Install the simulated NPU in this process (idempotent; each call also lets Ray, if it was
    imported since, see simulated tensors as device tensors). A `ROLL_SIM_*` variable set to a value
    it does not take is refused first, with a ConfigError that names it (`settings.py`)."""
    from roll_device.sim import settings

    settings.check_all()
    with _lock:
        if _installed["done"]:
            _expose_to_ray()
            return
        import torch

        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", "npu"):
            raise RuntimeError(
                f"cannot simulate the NPU: PrivateUse1 is already registered as '{current}' "
                "in this process (run the simulation in a process of its own)"
            )
        if current == "npu" and hasattr(torch, "npu") and not _is_sim_module(torch.npu):
            raise RuntimeError(
                "cannot simulate the NPU: torch_npu is loaded in this process; use ROLL_DEVICE=npu"
            )
        from roll_device.sim import backend, device_guard, device_module
        from roll_device.sim.devices import device_count
        from roll_device.sim.tensor import follow_storage_resizes

        torch.utils.backend_registration._setup_privateuseone_for_python_backend(
            rename="npu", backend_module=device_module
        )
        device_guard.register(device_count())
        backend.register_kernels()
        backend.register_hccl()
        follow_storage_resizes()
        _installed["done"] = True
        _expose_to_ray()


def _expose_to_ray() -> None:
    if "ray.cloudpickle" in sys.modules:
        from roll_device.sim.ray_pickling import expose_to_ray

        expose_to_ray()


def _is_sim_module(module) -> bool:
    return getattr(module, "__name__", "") == "roll_device.sim.device_module"
