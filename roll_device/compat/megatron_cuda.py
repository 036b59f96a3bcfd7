"""Redirects of the CUDA calls megatron-core hard-codes, to a bound platform (the CPU here),
active only inside `redirect_cuda(platform)`.

What megatron-core 0.16 hard-codes, and where it goes instead:
- `torch.cuda.current_device()` / `synchronize()` / `empty_cache()` -> the platform's members;
- the CUDA RNG (`torch.cuda.get_rng_state` / `set_rng_state` / `manual_seed` and megatron's own
  `_get_cuda_rng_state` / `_set_cuda_rng_state`, which the RNG tracker's `fork()` uses) -> the
  platform's generator;
- factory calls with `device="cuda"` (or a bare index) in the schedules, optimizer and grad
  clipping -> the platform's device (a torch function mode rewrites the `device` argument);
- `Tensor.cuda()` (the tied-embedding copy on the last pipeline stage) -> `.to(` the platform's
  device `)`;
- `torch.cuda.Stream()` / `current_stream()` / `stream(...)` (the MoE all-to-all dispatcher copies
  its token counts to the host on a side stream and waits on the event it records) -> the
  platform's streams, whose `record_event` returns an event (the host's stream returns None);
- the dispatcher's `maybe_move_tensor_to_cpu`, which copies only CUDA tensors (to numpy arrays
  where asked, the split sizes `all_to_all_single` takes) -> the same for the platform's tensors;

- `Tensor.type()` checks against `torch.cuda.FloatTensor` in grad clipping and the (distributed)
  optimizer -> tensors on the platform's device answer with the CUDA spelling.

Backward functions that make tensors on `torch.cuda.current_device()` (the all-to-all's, the
expert-tensor-parallel gathers') are redirected only where the function mode is on inside the
backward: a backward started by `torch.autograd.backward` runs inside the mode's own handler of
that call, where the mode is off, so the trainer has megatron start its backward itself
(`deallocate_pipeline_outputs=True`: megatron's `custom_backward` calls the autograd engine
directly).

The patches are process-wide while a scope is open (scopes nest; the outermost restores), so a
trainer opens one around each of its calls and nothing outside them sees the redirect.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

from roll_device.platforms.base import Platform

_lock = threading.RLock()
_depth = {"open": 0}
_saved: list[tuple[object, str, object]] = []


def _is_cuda_device(device) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


class DeviceArgumentRedirect(TorchFunctionMode):
    """Rewrites `device=` arguments naming CUDA and `Tensor.cuda()` to the platform's device, and
    answers `Tensor.type()` for tensors on that device with the CUDA spelling megatron checks for."""

    def __init__(self, platform: Platform) -> None:
        super().__init__()
        self.platform = platform

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            index = kwargs.get("device", args[1] if len(args) > 1 else None)
            return args[0].to(self.platform.device(index if isinstance(index, int) else None))
        device = kwargs.get("device")
        if device is not None and _is_cuda_device(device):
            index = device if isinstance(device, int) else torch.device(device).index
            kwargs = {**kwargs, "device": self.platform.device(index)}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            tensor = args[0]
            if self.platform.is_device_tensor(tensor):
                return "torch.cuda." + tensor.type().rsplit(".", 1)[-1]
        return func(*args, **kwargs)


class PlatformStream:
    """A new stream of the platform that answers `record_event` with a recorded event (the
    host's placeholder stream records nothing and returns None); the rest is the stream's."""

    def __init__(self, platform: Platform) -> None:
        self.platform, self.stream = platform, platform.new_stream()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def record_event(self, event=None):
        event = event or self.platform.new_event()
        event.record(self.stream)
        return event


def _host_copier(platform: Platform):
    def to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
        if not (torch.is_tensor(tensor) and platform.is_device_tensor(tensor)):
            return tensor
        copy = tensor.cpu()
        return copy.numpy() if as_numpy else copy

    return to_host


def _replacements(platform: Platform) -> list[tuple[object, str, object]]:
    from megatron.core.tensor_parallel import random as megatron_random
    from megatron.core.transformer.moe import token_dispatcher

    def get_state(*_args, **_kwargs):
        return platform.get_rng_state()

    def set_state(state, *_args, **_kwargs):
        platform.set_rng_state(state)

    return [
        (torch.cuda, "current_device", platform.current_device),
        (torch.cuda, "synchronize", lambda *_args, **_kwargs: platform.synchronize()),
        (torch.cuda, "empty_cache", platform.empty_cache),
        (torch.cuda, "Stream", lambda *_args, **_kwargs: PlatformStream(platform)),
        (torch.cuda, "current_stream", lambda *_args, **_kwargs: platform.current_stream()),
        (torch.cuda, "stream", platform.stream),
        (torch.cuda, "get_rng_state", get_state),
        (torch.cuda, "set_rng_state", set_state),
        (torch.cuda, "manual_seed", platform.manual_seed),
        (megatron_random, "_get_cuda_rng_state", get_state),
        (megatron_random, "_set_cuda_rng_state", set_state),
        (token_dispatcher, "maybe_move_tensor_to_cpu", _host_copier(platform)),
    ]


@contextlib.contextmanager
def redirect_cuda(platform: Platform):
    """Inside this scope megatron-core's CUDA calls run on `platform`."""
    with _lock:
        if _depth["open"] == 0:
            for owner, name, replacement in _replacements(platform):
                _saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, replacement)
        _depth["open"] += 1
    try:
        with DeviceArgumentRedirect(platform):
            yield
    finally:
        with _lock:
            _depth["open"] -= 1
            if _depth["open"] == 0:
                while _saved:
                    owner, name, original = _saved.pop()
                    setattr(owner, name, original)


def is_active() -> bool:
    """Whether a redirect scope is open in this process."""
    return _depth["open"] > 0
