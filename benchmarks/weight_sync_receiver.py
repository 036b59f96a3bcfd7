"""The receiving end of benchmarks/weight_sync.py, in its own process: one `WeightReceiver` per path
loading into preallocated parameters, the receiving rank of the bare gloo broadcast the gloo paths
are measured against, and the second of two copies run at once; `Receiver` drives it from the
trainer's end. Also the state dicts both ends make and the two limits (memcpy, bare gloo)."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import torch
import torch.distributed as dist

import roll_device as rd
from roll_device.comm import WeightReceiver, weights_hash
from roll_device.comm.buckets import tensor_bytes
from roll_device.comm.groups import MESSAGE_BYTES

RAW_MESSAGE = MESSAGE_BYTES  # the message size weight sync itself uses over gloo


def make_state(shapes, dtype: torch.dtype, fill: bool) -> dict[str, torch.Tensor]:
    state = {}
    for name, shape in shapes:
        t = torch.empty(shape, dtype=dtype)
        state[name] = t.uniform_(-0.1, 0.1) if fill else t.zero_()
    return state


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def receiver_main(conn, threads: int, port: int) -> None:
    """The rollout end: one WeightReceiver per path (by label), all loading into one set of
    preallocated parameters; also the receiving rank of the bare gloo broadcast, and the second
    of two copies run at once."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    params: dict[str, torch.Tensor] = {}
    scratch: dict[str, torch.Tensor] = {}
    receivers: dict[str, WeightReceiver] = {}
    copying = [0.0]  # seconds the last sync spent copying into the parameters

    def apply(named):
        copying[0] = 0.0
        for name, tensor in named:
            start = time.perf_counter()
            params[name].copy_(tensor)
            copying[0] += time.perf_counter() - start

    while (request := conn.recv()) is not None:
        command, args = request
        answer = None
        if command == "params":
            params = make_state(*args, fill=False)
            scratch = make_state(*args, fill=False)
        elif command == "connect":
            label, endpoint = args
            receivers[label] = WeightReceiver(endpoint, 1, rd.get_platform("cpu"), timeout_s=120)
            receivers[label].connect()
        elif command == "receive":
            answer = {"seconds": receivers[args[0]].receive(apply).seconds, "copying": copying[0]}
        elif command == "copy":
            answer = memcpy_seconds(params, scratch)
        elif command == "close":
            receivers.pop(args[0]).close()
        elif command == "raw":
            bare_gloo_seconds(list(params.values()))
        elif command == "zero":
            for tensor in params.values():
                tensor.zero_()
        elif command == "hash":
            answer = weights_hash(params.items())
        conn.send(answer)
    dist.destroy_process_group()


def bare_gloo_seconds(tensors: list[torch.Tensor]) -> float:
    """A bare gloo broadcast of the same bytes from rank 0: each tensor straight from the trainer's
    state into the receiver's parameters (no packing, no headers, no copy after), in messages of
    at most `RAW_MESSAGE` bytes, all started at once and then waited for."""
    start = time.perf_counter()
    works = [
        dist.broadcast(data[offset : offset + RAW_MESSAGE], src=0, async_op=True)
        for data in map(tensor_bytes, tensors)
        for offset in range(0, data.numel(), RAW_MESSAGE)
    ]
    for work in works:
        work.wait()
    return time.perf_counter() - start


class Receiver:
    def __init__(self, threads: int) -> None:
        port = free_port()
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=receiver_main, args=(child, threads, port))
        self.process.start()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)

    def ask(self, command: str, *args):
        self.conn.send((command, args))
        return self.conn.recv()

    def start(self, command: str, *args) -> None:
        self.conn.send((command, args))

    def answer(self):
        return self.conn.recv()

    def stop(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=60)
        dist.destroy_process_group()


def memcpy_seconds(state: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    for name, tensor in state.items():
        targets[name].copy_(tensor)
    return time.perf_counter() - start


QWEN_05B = {"vocab": 151936, "hidden": 896, "intermediate": 4864, "heads": 14, "kv_heads": 2, "head_dim": 64}


def qwen_shapes(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of Qwen2.5-0.5B with `layers` decoder layers (tied embeddings)."""
    q = QWEN_05B
    h, kv = q["hidden"], q["kv_heads"] * q["head_dim"]
    shapes = [("model.embed_tokens.weight", (q["vocab"], h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (q["intermediate"], h)),
            (p + "mlp.up_proj.weight", (q["intermediate"], h)),
            (p + "mlp.down_proj.weight", (h, q["intermediate"])),
        ]
    return shapes + [("model.norm.weight", (h,))]
