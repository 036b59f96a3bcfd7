"""The two ends of a weight sync, run inside worker processes (tests/comm/workers.py).

A trainer end exports a real tiny Qwen2 (transformers) built from a seed, on its platform's
device; a rollout end holds another such model and loads what it receives into it. Both report
the weights hash (`roll_device.comm.weights_hash`) and a greedy generation, so a test can check
that after a sync the rollout's weights equal the trainer's export and that its generation
follows. Platforms are real (CPU) or the simulated NPU (`npu-sim`, labelled so in every result).
"""

from __future__ import annotations

import torch

import roll_device as rd
from roll_device.comm import WeightReceiver, WeightSender, plan_sync, weights_hash
from tests.configs import weight_sync

PROMPT = [[1, 5, 6, 7, 8]]
_state: dict = {}


def _platform(kind: str):
    platform = rd.get_platform(kind)
    if platform.simulated:
        platform.device_module()  # installs the simulated NPU in this process
    return platform


def _model(seed: int, platform):
    from transformers import Qwen2ForCausalLM

    from roll_device.models.tiny import build_config

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(build_config()).to(platform.device()).eval()


def _generation(model, platform) -> list[int]:
    ids = torch.tensor(PROMPT, device=platform.device())
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    return out[0, len(PROMPT[0]) :].cpu().tolist()


def _report(model, platform) -> dict:
    return {
        "hash": weights_hash(model.state_dict().items()),
        "generation": _generation(model, platform),
        "device": str(next(model.parameters()).device),
        "platform": platform.name,
    }


def start_sender(
    src: str,
    dst: str,
    forced: str,
    colocated: bool,
    same_node: bool,
    receivers: int,
    bucket_bytes: int,
    verify: bool,
) -> dict:
    platform = _platform(src)
    plan = plan_sync(src, dst, colocated=colocated, same_node=same_node, forced=forced)
    options = weight_sync(path=forced, bucket_bytes=bucket_bytes, verify=verify, timeout_s=60)
    _state["sender"] = WeightSender(plan, platform, receivers, options)
    _state["platform"] = platform
    return {"endpoint": _state["sender"].endpoint, "plan": plan.describe()}


def _export(model, fail_after: int | None):
    for index, (name, param) in enumerate(model.named_parameters()):
        if fail_after is not None and index == fail_after:
            raise RuntimeError(f"export failed at {name} (injected by the test)")
        yield name, param.detach()


def send(seed: int, version: int, fail_after: int | None = None) -> dict:
    """Export the model of `seed` (its parameters, on the trainer's device) as `version`."""
    platform = _state["platform"]
    model = _model(seed, platform)
    stats = _state["sender"].send(_export(model, fail_after), version=version)
    return {**_report(model, platform), "stats": stats}


def start_receiver(endpoint, rank: int, kind: str, seed: int) -> dict:
    platform = _platform(kind)
    _state["platform"] = platform
    _state["model"] = _model(seed, platform)
    _state["receiver"] = WeightReceiver(endpoint, rank, platform, timeout_s=60)
    return _report(_state["model"], platform)


def connect(side: str) -> None:
    _state[side].connect()


def close(side: str) -> None:
    _state[side].close()


def _load_into(model):
    params = model.state_dict()

    def apply(named):
        for name, tensor in named:
            params[name].copy_(tensor)

    return apply


def _flip_a_byte_of(receiver, bucket: int) -> None:
    """Damage bucket `bucket` as this receiver reads it (a copy: the shared slot stays intact for
    other receivers), as a faulty link would."""
    buckets = receiver.transport.buckets

    def damaged(seq):
        for header, data in buckets(seq):
            if header.index == bucket and data is not None:
                data = data.clone()
                data[0] = data[0] ^ 0xFF
            yield header, data

    receiver.transport.buckets = damaged


def receive(corrupt_bucket: int | None = None) -> dict:
    receiver, model, platform = _state["receiver"], _state["model"], _state["platform"]
    if corrupt_bucket is not None:
        _flip_a_byte_of(receiver, corrupt_bucket)
    try:
        stats = receiver.receive(_load_into(model))
    finally:
        receiver.transport.__dict__.pop("buckets", None)
    return {**_report(model, platform), "version": receiver.version, "stats": stats}


def receive_partially() -> dict:
    """An apply that stops after one tensor: the receiver must refuse it."""
    receiver = _state["receiver"]
    return {"stats": receiver.receive(lambda named: next(iter(named)))}


def mixed_state(seed: int) -> dict[str, torch.Tensor]:
    """Tensors of 1 MiB and more (sent from where they are by broadcast transports) between
    small ones (packed), one larger than a 4 MiB bucket, bf16 and int among float32."""
    g = torch.Generator().manual_seed(seed)
    return {
        "norm": torch.randn(96, generator=g),
        "big": torch.randn(512, 640, generator=g),  # 1.25 MiB
        "bias": torch.randn(33, generator=g).to(torch.bfloat16),
        "bigger": torch.randn(700, 512, generator=g),  # 1.37 MiB
        "huge": torch.randn(1200, 1024, generator=g),  # 4.7 MiB: alone
        "steps": torch.arange(5),
    }


def send_mixed(seed: int, version: int) -> dict:
    """Send `mixed_state(seed)` from the trainer end's device."""
    state = {name: t.to(_state["platform"].device()) for name, t in mixed_state(seed).items()}
    stats = _state["sender"].send(state.items(), version=version)
    return {"hash": weights_hash(state.items()), "stats": stats}


def receive_copies() -> dict:
    """Receive into a dict of copies (this end's model is not involved)."""
    got = {}
    stats = _state["receiver"].receive(lambda named: got.update((n, t.clone()) for n, t in named))
    return {
        "hash": weights_hash(got.items()),
        "devices": sorted({str(t.device) for t in got.values()}),
        "stats": stats,
    }


def report() -> dict:
    return {**_report(_state["model"], _state["platform"]), "version": _state["receiver"].version}
