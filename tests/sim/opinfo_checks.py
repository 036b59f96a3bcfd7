"""PyTorch's OpInfo database run on the simulated NPU and on the CPU, compared (in a process of its own).

For each OpInfo op that the CPU supports in float32, the first samples (or all) of the OpInfo's own sample
inputs, made on each device from the same seed, run on the CPU and on the simulated NPU (`npu:0`):
the function variant (forward), the in-place variant where the op has one, the `out=` variant where
it has one (into empty tensors the kernel resizes), and the backward where the OpInfo supports
autograd (gradients of every differentiable output against fixed cotangents). Each simulated result must
report `npu:0` and its own metadata (shape, strides, storage offset, dtype, layout, conj and neg
bits) must equal the CPU result's before any data is moved back; then the values must agree within
1e-5. Where the CPU raises, the simulated NPU must raise the same exception type. Random ops are
compared too: both runs start from the same seed and the simulated NPU draws from the CPU generator.

No op is left out; where a comparison is narrowed (uninitialized results, gradients' strides, attention's precision),
`NARROWED` says what and why. Every result here is a SIMULATION: CPU kernels behind tensors that
report `npu:0`.
"""

from __future__ import annotations

import itertools
import sys

import torch
from torch.utils._pytree import tree_flatten, tree_map

from tests.isolated import simulated_npu

DTYPE = torch.float32
TOLERANCE = 1e-5
LOOSE = 1e-4  # where `NARROWED` says "precision"
DEVICES = ("cpu", "npu", "npu:0")
SEED = 1234
MODES = ("forward", "inplace", "out", "backward")

UNINITIALIZED = "its result is uninitialized memory: only the result's metadata is defined"
# The one place where a comparison is narrowed: op name (variant after a dot) -> check -> (what is
# not compared: "values", "stride", or "precision" (values within LOOSE), space-separated; why).
# No op is left out whole.
NARROWED: dict[str, dict[str, tuple[str, str]]] = {
    **{
        name: dict.fromkeys(("forward", "inplace", "out"), ("values", UNINITIALIZED))
        for name in (
            "empty",
            "empty_like",
            "empty_permuted",
            "empty_strided",
            "new_empty",
            "new_empty_strided",
        )
    },
    "nn.functional.scaled_dot_product_attention": {
        mode: (
            "precision stride",
            (
                "the simulated NPU takes torch's math path, the CPU its flash kernel: values agree within "
                f"{LOOSE} (not {TOLERANCE}) and the gradients' strides differ"
            ),
        )
        for mode in ("forward", "backward")
    },
    "prod": {
        "backward": (
            "stride",
            "torch's prod backward formula takes its safe path for any tensor subclass: an empty input's gradient is not expanded",
        )
    },
    "ormqr": {
        "backward": (
            "stride",
            (
                "torch's ormqr backward formula takes an out-of-place path for any tensor subclass (and "
                "under a dispatch mode on the CPU too), which gives the gradient row-major strides; values agree"
            ),
        )
    },
}


def conformance(samples: str = "2", only: str = "") -> dict:
    """Compare the first `samples` samples of each op ("all": every sample) of `only` (comma-separated
    names) if given, else of every op."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo import core

    # Each sample iterator looks for the unittest.TestCase it runs in (inspect.stack(), which reads
    # every frame's source: most of this harness's time); there is none here, so it finds nothing.
    for module in (common_utils, core):
        module.extract_test_fn = lambda: None
    simulated_npu()
    wanted = set(filter(None, only.split(",")))
    report = {mode: {} for mode in MODES}
    report["cpu_unsupported"] = []
    report["cpu_never_ran"] = {mode: [] for mode in MODES}  # both devices raised
    report["narrowed_unknown"] = sorted(set(NARROWED) - {op_name(op) for op in op_db})
    for op in op_db:
        name = op_name(op)
        if wanted and name not in wanted and op.name not in wanted:
            continue
        if DTYPE not in op.supported_dtypes("cpu"):
            report["cpu_unsupported"].append(name)
            continue
        print(name, file=sys.stderr, flush=True)  # names the op if one ever takes the process down
        for mode, (problem, ran) in compare_op(op, None if samples == "all" else int(samples)).items():
            report[mode][name] = problem
            if not ran:
                report["cpu_never_ran"][mode].append(name)
    return report


def op_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def compare_op(op, count: int | None) -> dict[str, tuple[str, bool]]:
    """{check: (what differed, "" when the NPU agrees; whether the CPU ran any sample)} for the
    checks "forward", "inplace" (where the op has an in-place variant), "out" (where it takes `out=`),
    "backward" (with autograd), over the op's first `count` samples (None: all of them)."""
    checks = {"forward": _forward}
    if op.inplace_variant is not None:
        checks["inplace"] = _inplace
    if op.supports_out:
        checks["out"] = _out
    if op.supports_autograd:
        checks["backward"] = _backward
    outcome = dict.fromkeys(checks, ("", False))
    narrowed = NARROWED.get(op_name(op), {})
    for i, (cpu, npu) in enumerate(itertools.islice(_sample_pairs(op), count)):
        for mode, check in checks.items():
            problem, ran = outcome[mode]
            if problem:
                continue  # the first difference is the one reported
            if isinstance(npu, _Raised):
                outcome[mode] = (f"sample {i}: npu failed to make it: {_describe(npu)}", ran)
                continue
            try:
                ignore = narrowed.get(mode, ("", ""))[0]
                if mode != "out" and not _lands_on_npu(npu):  # `out=` tensors are on npu:0
                    ignore += " device"
                problem = _compare(_parts(cpu), _parts(npu), what="input")
                if not problem:
                    problem, ran_now = check(op, cpu, npu, ignore)
                    ran = ran or ran_now
            except Exception as exc:  # noqa: BLE001 (a failure of the harness on one op is reported)
                problem = f"check failed: {type(exc).__name__}: {_line(exc)}"
            outcome[mode] = (f"sample {i}: {problem}" if problem else "", ran)
    return outcome


def _sample_pairs(op):
    """The op's samples made on the CPU and, from the same seed, on `npu:0` (the simulated NPU
    draws from the CPU generator, so both hold the same values; `_compare` checks that they do).
    A sample the simulated NPU fails to make is a `_Raised`. Where the sample function makes fewer
    samples on `npu` (masked cumsum/cumprod drop masks whose type is not exactly `torch.Tensor`, as a
    wrapper subclass's is not), or makes them with other arguments (sort's `stable=True` keyword only on
    the CPU), the CPU sample moved to `npu:0` stands in."""
    grad = op.supports_autograd
    torch.manual_seed(SEED)
    on_cpu = op.sample_inputs("cpu", DTYPE, requires_grad=grad)
    torch.manual_seed(SEED)
    on_npu = op.sample_inputs("npu", DTYPE, requires_grad=grad)
    while True:
        state = torch.get_rng_state()
        cpu = next(on_cpu, None)
        if cpu is None:
            return
        torch.set_rng_state(state)
        try:
            npu = next(on_npu, None)
        except Exception as exc:  # noqa: BLE001 (reported as the op's failure)
            npu = _Raised(exc)
        if npu is None or (not isinstance(npu, _Raised) and _structure(npu) != _structure(cpu)):
            npu = _moved_to_npu(cpu)
        yield cpu, npu


# ---- the three checks: each gives (what differed, "" when the NPU agrees; whether the CPU ran) ---
def _forward(op, cpu, npu, ignore: str) -> tuple[str, bool]:
    expected = _run(op, cpu)
    return _compare(expected, _run(op, npu), ignore=ignore), _ran(expected)


def _inplace(op, cpu, npu, ignore: str) -> tuple[str, bool]:
    cpu, npu = _detached(cpu), _detached(npu)
    expected = _run(op.inplace_variant, cpu)
    problem = _compare(expected, _run(op.inplace_variant, npu), ignore=ignore) or _compare(
        cpu.input, npu.input, what="input after the in-place op", ignore=ignore
    )
    return problem, _ran(expected)


def _out(op, cpu, npu, ignore: str) -> tuple[str, bool]:
    """The op with `out=`: empty tensors the kernel resizes, like the ones `arange` makes itself."""
    result = _run(op, _detached(cpu))
    leaves = tree_flatten(result)[0] if _ran(result) else []
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        return "", False

    def outs(device):
        empty = [torch.empty(0, dtype=t.dtype, device=device) for t in leaves]
        return empty[0] if isinstance(result, torch.Tensor) else tuple(empty)

    cpu_out, npu_out = outs("cpu"), outs("npu:0")
    expected = _run(lambda *a, **k: op(*a, out=cpu_out, **k), _detached(cpu))
    problem = _compare(
        expected, _run(lambda *a, **k: op(*a, out=npu_out, **k), _detached(npu)), ignore=ignore
    )
    return problem or _compare(cpu_out, npu_out, what="out", ignore=ignore), _ran(expected)


def _backward(op, cpu, npu, ignore: str) -> tuple[str, bool]:
    expected = _gradients(op, cpu)
    return _compare(expected, _gradients(op, npu), what="gradient", ignore=ignore), _ran(expected)


def _ran(result) -> bool:
    """Whether the CPU gave a result (not an error, not "no gradient to take")."""
    return result is not None and not isinstance(result, _Raised)


# ---- running and comparing -----------------------------------------------------------------------
class _Raised:
    """What a run raised, compared by exception type."""

    def __init__(self, exc: BaseException) -> None:
        self.type, self.text = type(exc).__name__, _line(exc)


def _run(function, sample):
    torch.manual_seed(SEED)
    try:
        return function(sample.input, *sample.args, **sample.kwargs)
    except Exception as exc:  # noqa: BLE001 (both devices must raise alike)
        return _Raised(exc)


def _gradients(op, sample):
    out = _run(op, sample)
    if isinstance(out, _Raised):
        return out
    outputs = [t for t in tree_flatten(sample.output_process_fn_grad(out))[0] if _differentiable(t)]
    inputs = [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0] if _needs_grad(t)]
    if not outputs or not inputs:
        return None
    cotangents = [_cotangent(t) for t in outputs]
    try:
        return torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
    except Exception as exc:  # noqa: BLE001 (both devices must raise alike)
        return _Raised(exc)


def _differentiable(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def _needs_grad(t) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def _cotangent(t: torch.Tensor) -> torch.Tensor:
    """A fixed, non-constant cotangent of `t`'s shape and dtype, made on the CPU (same on both runs)."""
    n = t.numel()
    values = (
        torch.linspace(-1.0, 1.0, n, dtype=torch.float64).sin() if n else torch.zeros(0, dtype=torch.float64)
    )
    values = values.reshape(t.shape)
    if t.is_complex():
        values = torch.complex(values, values.flip(tuple(range(values.dim()))))
    return values.to(dtype=t.dtype, device=t.device)


def _compare(cpu, npu, what: str = "output", ignore: str = "") -> str:
    """ "" when `npu` (the simulated run's result) matches `cpu`, else the first difference; `ignore`
    names what is not compared ("values" or "stride", from `NARROWED`)."""
    if isinstance(cpu, _Raised) or isinstance(npu, _Raised):
        if isinstance(cpu, _Raised) and isinstance(npu, _Raised) and cpu.type == npu.type:
            return ""
        return f"cpu gave {_describe(cpu)}, npu gave {_describe(npu)}"
    cpu_leaves, cpu_spec = tree_flatten(cpu)
    npu_leaves, npu_spec = tree_flatten(npu)
    if cpu_spec != npu_spec:
        return f"result structure differs: cpu {cpu_spec}, npu {npu_spec}"
    for k, (c, n) in enumerate(zip(cpu_leaves, npu_leaves)):
        problem = _compare_leaf(c, n, on_npu=what != "input", ignore=ignore)
        if problem:
            return f"{what} {k}: {problem}"
    return ""


def _compare_leaf(cpu, npu, on_npu: bool, ignore: str) -> str:
    if not isinstance(cpu, torch.Tensor):
        if not on_npu:  # an input other than a tensor: a device name, an option, a module
            return ""
        if isinstance(npu, torch.Tensor):
            return f"npu gave a tensor where cpu gave {type(cpu).__name__}"
        return _compare_values(cpu, npu)
    if not isinstance(npu, torch.Tensor):
        return f"npu gave {type(npu).__name__} where cpu gave a tensor"
    if on_npu and "device" in ignore.split():  # a factory told device="cpu", or told no device
        if npu.device.type != cpu.device.type:
            return f"npu result on {npu.device}, cpu result on {cpu.device}"
    elif on_npu and npu.device.type != "npu":
        return f"npu result on {npu.device}"
    for field in ("shape", "dtype", "layout", "is_conj", "is_neg", "requires_grad"):
        problem = _differs(field, cpu, npu)
        if problem:
            return problem
    if cpu.layout == torch.strided:
        for field in ("stride", "storage_offset"):
            problem = "" if field in ignore.split() else _differs(field, cpu, npu)
            if problem:
                return problem
    if "values" in ignore.split():
        return ""
    return _compare_values(
        cpu.detach(), npu.detach().cpu(), LOOSE if "precision" in ignore.split() else TOLERANCE
    )


def _differs(field: str, cpu, npu) -> str:
    c, n = getattr(cpu, field), getattr(npu, field)
    c, n = (c(), n()) if callable(c) else (c, n)
    return f"{field}: cpu {c}, npu {n}" if c != n else ""


def _compare_values(cpu, npu, tolerance: float = TOLERANCE) -> str:
    try:
        if isinstance(cpu, torch.Tensor) and cpu.layout != torch.strided:
            cpu, npu = cpu.to_dense(), npu.to_dense()
        torch.testing.assert_close(
            npu, cpu, rtol=tolerance, atol=tolerance, equal_nan=True, check_device=False, check_stride=False
        )
    except (AssertionError, TypeError, ValueError, RuntimeError) as exc:
        if not isinstance(cpu, torch.Tensor) and cpu == npu:
            return ""
        return f"values differ: {_line(exc)}"
    return ""


# ---- samples ---------------------------------------------------------------------------------------
def _parts(sample) -> tuple:
    return sample.input, sample.args, sample.kwargs


def _structure(sample) -> tuple:
    """The sample's shape of arguments, tensor shapes and values other than devices (the same sample
    made on both devices has the same)."""
    leaves, spec = tree_flatten(_parts(sample))
    kept = [tuple(x.shape) if isinstance(x, torch.Tensor) else repr(x) for x in leaves if not _is_device(x)]
    return spec, kept


def _is_device(x) -> bool:
    return isinstance(x, torch.device) or (isinstance(x, str) and x in DEVICES)


def _lands_on_npu(sample) -> bool:
    """Whether the op's results belong on `npu:0`: the sample names it as `device=`, or names no
    device and holds a tensor there (a factory told `device="cpu"`, or no device, gives CPU tensors)."""
    if isinstance(sample, _Raised):
        return True
    device = sample.kwargs.get("device")
    if device is not None:
        return torch.device(device).type == "npu"
    return any(
        isinstance(t, torch.Tensor) and t.device.type == "npu" for t in tree_flatten(_parts(sample))[0]
    )


def _moved_to_npu(sample):
    """The sample with its tensors copied to `npu:0` as leaves (autograd flag kept)."""

    def move(x):
        return x.detach().to("npu:0").requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x

    return _mapped(sample, move, move)


def _detached(sample):
    """A copy of the sample without autograd, every tensor cloned (for a variant that writes into
    its input, its `out=` or an argument, as batch norm's running statistics)."""

    def copy(x):
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    return _mapped(sample, copy, copy)


def _mapped(sample, on_input, on_args):
    from torch.testing._internal.opinfo.core import SampleInput

    return SampleInput(
        tree_map(on_input, sample.input),
        args=tree_map(on_args, sample.args),
        kwargs=tree_map(on_args, sample.kwargs),
        output_process_fn_grad=sample.output_process_fn_grad,
    )


def _describe(result) -> str:
    if isinstance(result, _Raised):
        return f"{result.type}: {result.text}"
    return "a result"


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


if __name__ == "__main__":
    result = conformance(*sys.argv[1:])
    for mode in MODES:
        outcomes = result[mode]
        bad = {k: v for k, v in outcomes.items() if v}
        print(f"{mode}: {len(outcomes) - len(bad)}/{len(outcomes)} agree")
        for k, v in bad.items():
            print(f"  {k}: {v}")
    print("not in float32 on the CPU:", " ".join(result["cpu_unsupported"]))
    for mode, names in result["cpu_never_ran"].items():
        print(f"{mode}, no sample ran on the CPU (nor on the NPU):", " ".join(names))
