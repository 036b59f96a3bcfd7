"""Count the device call sites of RL frameworks and how many a roll-device `Platform` member serves.

Reads the runtime packages of ROLL (`roll/`), verl (`verl/`) and OpenRLHF (`openrlhf/`) from git
mirrors (no checkout: files are read with `git cat-file`), skipping tests, examples and docs, and
finds every device use in them: attributes of a device module (`torch.cuda.X`, `torch.npu.X`,
verl's `get_torch_device().X`, ROLL's `current_platform.X`), `torch_npu` uses, the frameworks' own
device helpers (verl's `get_device_name()`, `get_nccl_backend()`, ...), hard-coded device and
backend strings, `.cuda()`, `.is_cuda`, `num_gpus`, cuDNN switches, and vendor environment variables.

Each use is one call site and belongs to one need: the platform member that serves it (`RULES`
below, or an attribute with the name of a `Platform` member), or, where none does, the use itself.
Coverage = served call sites / all call sites, and served needs / all distinct needs. The table
and the numbers are written into docs/porting.md (section `device-needs`).

Usage: python benchmarks/device_needs.py [--mirrors /work/.mirror] [--platform-root DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.doc_sections import replace_section

DOC = ROOT / "docs" / "porting.md"
FRAMEWORKS = {  # name: (mirror directory under --mirrors, runtime package)
    "ROLL": ("alibaba+ROLL", "roll/"),
    "verl": ("volcengine+verl", "verl/"),
    "OpenRLHF": ("OpenRLHF+OpenRLHF", "openrlhf/"),
}
SKIP = re.compile(r"(^|/)(tests?|examples?|docs?)/|(^|/)test_[^/]*\.py$")
DM = r"\b(?:torch\.cuda|torch\.npu|torch_npu\.npu|get_torch_device\(\)|current_platform)\.(?:memory\.|random\.)?"
NOT_SERVED = None

# (pattern, framework use shown in the table, platform member or NOT_SERVED). First match wins
# at a position; device-module attributes not listed fall to `attribute_need`.
RULES: list[tuple[str, str, str | None]] = [
    # profiling
    (
        DM + r"nvtx\.(?:range_push|range_start)\b|\bmstx\.range_start\b|\bmark_start_range\(",
        "nvtx/mstx range start",
        "range_push",
    ),
    (
        DM + r"nvtx\.(?:range_pop|range_end)\b|\bmstx\.range_end\b|\bmark_end_range\(",
        "nvtx/mstx range end",
        "range_pop",
    ),
    (
        DM + r"nvtx\.range\b|\bmstx\.mstx_range\b|\bmark_annotate\(|\bnvtx\.annotate\b",
        "nvtx.range / mstx_range",
        "range",
    ),
    (DM + r"nvtx\.mark\b|\bmstx\.mark\b", "nvtx.mark / mstx.mark", "mark"),
    (DM + r"profiler\.start\b|cudaProfilerStart", "torch.cuda.profiler.start", "profiler_start"),
    (DM + r"profiler\.stop\b|cudaProfilerStop", "torch.cuda.profiler.stop", "profiler_stop"),
    (r"ProfilerActivity\.(?:CUDA|NPU)\b", "ProfilerActivity.CUDA / .NPU", "profiler_activity"),
    (r"\btorch_npu\.profiler\.\w+", "torch_npu.profiler.*", "profile"),
    # device facts
    (DM + r"get_device_name\b", "torch.cuda.get_device_name", "device_name"),
    (DM + r"get_device_properties\b", "torch.cuda.get_device_properties", "device_properties"),
    (
        DM + r"get_device_capability\b|\bget_device_capability\(",
        "torch.cuda.get_device_capability",
        "device_capability",
    ),
    (DM + r"get_device_uuid\b|\bget_device_uuid\(", "device UUID (vLLM / NVML)", "device_uuid"),
    (r"\.is_(?:cuda|npu)\b(?!\()", "tensor.is_cuda", "is_device_tensor"),
    # devices and identity
    (
        DM + r"(?:device_type|device_name)\b|\bget_device_name\(\)|[\"'](?:cuda|npu)(?::\d+)?[\"']",
        '"cuda" / get_device_name()',
        "device_type",
    ),
    (r"\.(?:cuda|npu)\((?!\))?", ".cuda() / .npu()", "device"),
    (DM + r"current_device\b|\bget_device_id\(\)", "torch.cuda.current_device", "current_device"),
    (DM + r"init\b", "torch.cuda.init", "init"),
    (DM + r"is_available\b|\bis_torch_npu_available\(", "torch.cuda.is_available", "is_available"),
    (
        DM + r"is_(?:cuda|npu|rocm|xpu|tpu)\b|\bis_(?:cuda|npu)_available\b|\btorch\.version\.(?:cuda|hip)\b",
        "is_npu_available / is_cuda()",
        "kind",
    ),
    (
        r"\bimport torch_npu\b|\btorch_npu\.contrib\b|\btorch_npu\.__version__\b",
        "import torch_npu",
        "device_module",
    ),
    (
        r"\btorch_npu\.npu_\w+|\btorch_npu\.(?!npu\b|profiler\b|contrib\b)\w+",
        "torch_npu fused kernels",
        NOT_SERVED,
    ),
    (
        r"[\"'](?:nccl|hccl)[\"']|\bget_nccl_backend\(\)|" + DM + r"communication_backend\b",
        '"nccl" / get_nccl_backend()',
        "dist_backend",
    ),
    (
        r"\bnum_gpus\b|\bget_resource_name\(\)|" + DM + r"ray_device_key\b",
        "num_gpus / ray device key",
        "ray_actor_options",
    ),
    (r"\bray\.get_gpu_ids\(\)|\bget_accelerator_ids\(\)", "ray get_accelerator_ids()", "ray_device_ids"),
    # process environment
    (r"RAY_EXPERIMENTAL_NOSET_\w+", "RAY_EXPERIMENTAL_NOSET_*", "ray_noset_env"),
    (r"\bROCR_VISIBLE_DEVICES\b", "ROCR_VISIBLE_DEVICES", "pin_devices"),
    (
        r"\b(?:CUDA|HIP|ASCEND_RT)_VISIBLE_DEVICES\b|\bget_visible_devices_keyword\(\)|"
        + DM
        + r"(?:device_control_env_var|get_visible_gpus)\b",
        "CUDA_VISIBLE_DEVICES",
        "visible_devices_env",
    ),
    (
        DM + r"(?:update_env_vars_for_visible_devices|get_vllm_run_time_env_vars)\b",
        "visible-device pin of one rank",
        "rank_env",
    ),
    (r"\bNCCL_DEBUG\w*", "NCCL_DEBUG", NOT_SERVED),
    (
        r"\b(?:TORCH_)?NCCL_DETERMINISTIC\b|\bHCCL_DETERMINISTIC\b|\bCLOSE_MATMUL_K_SHIFT\b|\bCUBLAS_WORKSPACE_CONFIG\b",
        "CUBLAS_WORKSPACE_CONFIG / HCCL_DETERMINISTIC",
        "deterministic_env",
    ),
    (
        r"\btorch\.backends\.cudnn\.\w+|\buse_deterministic_algorithms\b",
        "torch.backends.cudnn.deterministic",
        "set_deterministic",
    ),
    (
        r"\b(?:TORCH_)?NCCL_\w+|\bHCCL_\w+|" + DM + r"(?:get_custom_env_vars|additional_env_vars)\b",
        "NCCL_* / HCCL_* variables",
        "collective_env",
    ),
    (r"\bCUDA_DEVICE_MAX_CONNECTIONS\b", "CUDA_DEVICE_MAX_CONNECTIONS", "training_env"),
    (r"\bPYTORCH_(?:CUDA|HIP|NPU)_ALLOC_CONF\b", "PYTORCH_CUDA_ALLOC_CONF", "allocator_env"),
    (r"\bTASK_QUEUE_ENABLE\b|\bVLLM_ASCEND_ENABLE_NZ\b", "TASK_QUEUE_ENABLE", "rollout_env"),
    # memory
    (DM + r"(?:device_memory_used|mem_get_info)\b", "torch.cuda.mem_get_info", "mem_get_info"),
    (
        DM + r"(?:reset_max_memory_allocated|reset_max_memory_cached|reset_peak_memory_stats)\b",
        "reset_peak_memory_stats",
        "reset_peak_memory_stats",
    ),
    (DM + r"set_per_process_memory_fraction\b", "set_per_process_memory_fraction", "set_memory_fraction"),
    (DM + r"_record_memory_history\b", "memory._record_memory_history", "record_memory_history"),
    (DM + r"_dump_snapshot\b", "memory._dump_snapshot", "dump_memory_snapshot"),
    (DM + r"_?set_allocator_settings\b", "memory._set_allocator_settings", "set_allocator_settings"),
    (r"\bset_expandable_segments\(", "expandable segments on/off", "set_expandable_segments"),
    (
        DM + r"clear_cublas_workspaces\b|_cuda_clearCublasWorkspaces",
        "clear cuBLAS workspaces",
        "clear_library_workspaces",
    ),
    (
        DM + r"cudart\(\)\.cudaHost(?:Register|Unregister)\b|\bcudaHost(?:Register|Unregister)\b",
        "cudaHostRegister",
        "pin_memory",
    ),
    # randomness, streams, graphs
    (DM + r"manual_seed(?:_all)?\b", "torch.cuda.manual_seed_all", "manual_seed"),
    (DM + r"get_rng_state_all\b", "torch.cuda.get_rng_state_all", "get_rng_state_all"),
    (DM + r"set_rng_state_all\b", "torch.cuda.set_rng_state_all", "set_rng_state_all"),
    (DM + r"Stream\b", "torch.cuda.Stream", "new_stream"),
    (DM + r"Event\b", "torch.cuda.Event", "new_event"),
    (DM + r"(?:CUDAGraph|NPUGraph)\b", "torch.cuda.CUDAGraph", "graph_class"),
    (DM + r"graph\b", "torch.cuda.graph", "graph_capture"),
    (DM + r"\w+", "", "attribute"),  # any other device-module attribute: see attribute_need
]
COMPILED = [(re.compile(p), use, member) for p, use, member in RULES]


def attribute_need(text: str, members: set[str]) -> tuple[str, str | None]:
    """A device-module attribute no rule names: served by the member of the same name, if any."""
    name = re.sub(DM, "", text)
    return (name, name) if name in members else (f"{text}", NOT_SERVED)


def source_files(mirror: Path, package: str) -> list[tuple[str, str]]:
    git = ["git", f"--git-dir={mirror}"]
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD", package], check=True, capture_output=True, text=True
    ).stdout.split()
    names = [n for n in names if n.endswith(".py") and not SKIP.search(n)]
    blob = subprocess.run(
        [*git, "cat-file", "--batch"],
        input="".join(f"HEAD:{n}\n" for n in names).encode(),
        check=True,
        capture_output=True,
    ).stdout
    files, pos = [], 0
    for name in names:
        header_end = blob.index(b"\n", pos)
        size = int(blob[pos:header_end].split()[2])
        files.append((name, blob[header_end + 1 : header_end + 1 + size].decode(errors="replace")))
        pos = header_end + 2 + size
    return files


def code_only(text: str) -> str:
    """`text` with comments and triple-quoted strings (docstrings) blanked: they are not call sites."""
    lines = text.splitlines(keepends=True)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):  # not Python 3: drop whole-line comments only
        return re.sub(r"^\s*#.*$", "", text, flags=re.MULTILINE)
    for tok in reversed(tokens):
        prose = tok.type == tokenize.COMMENT or (
            tok.type == tokenize.STRING and tok.string.endswith(('"""', "'''"))
        )
        if prose:
            (row, col), (end_row, end_col) = tok.start, tok.end
            head, tail = lines[row - 1][:col], lines[end_row - 1][end_col:]
            lines[row - 1 : end_row] = [head + "\n" * (end_row - row) + tail]
    return "".join(lines)


def uses(text: str, members: set[str]) -> list[tuple[str, str | None]]:
    """(need, member) of every device use in `text`, non-overlapping, earliest and longest first."""
    text = code_only(text)
    found = []
    for order, (pattern, use, member) in enumerate(COMPILED):
        for m in pattern.finditer(text):
            found.append((m.start(), -(m.end() - m.start()), order, m.end(), m.group(0), use, member))
    taken, end = [], -1
    for start, _, _, stop, matched, use, member in sorted(found):
        if start < end:
            continue
        end = stop
        if member == "attribute":
            taken.append(attribute_need(matched, members))
        else:  # a rule's member serves only where the Platform being measured has it
            taken.append((member or use, member if member in members else NOT_SERVED))
    return taken


def count(mirrors: Path, members: set[str]) -> dict:
    sites: dict[str, Counter] = defaultdict(Counter)  # need -> framework -> call sites
    served: dict[str, str | None] = {}
    for framework, (mirror, package) in FRAMEWORKS.items():
        for _, text in source_files(mirrors / mirror / "repo", package):
            for need, member in uses(text, members):
                sites[need][framework] += 1
                served[need] = member
    return {"sites": sites, "served": served}


def uses_of(member: str) -> str:
    return "; ".join(dict.fromkeys(use for _, use, m in RULES if m == member and use)) or member


def render(result: dict) -> str:
    sites, served = result["sites"], result["served"]
    total = sum(sum(c.values()) for c in sites.values())
    ok = sum(sum(c.values()) for n, c in sites.items() if served[n])
    needs_ok = sum(1 for n in sites if served[n])
    lines = [
        (
            f"Measured by `benchmarks/device_needs.py` over {', '.join(FRAMEWORKS)}: **{total} call sites, "
            f"{len(sites)} distinct needs; a platform member serves {ok} call sites ({100 * ok / total:.1f}%) "
            f"and {needs_ok} needs ({100 * needs_ok / len(sites):.1f}%)**."
        ),
        "",
        "| Framework use | Platform member | " + " | ".join(f"{f} sites" for f in FRAMEWORKS) + " |",
        "|---|---|" + "---|" * len(FRAMEWORKS),
    ]
    order = sorted(sites, key=lambda n: (served[n] is None, -sum(sites[n].values()), n))
    for need in order:
        member = served[need]
        use = uses_of(member) if member else need
        cell = f"`{member}`" if member else "not served"
        counts = " | ".join(str(sites[need][f]) for f in FRAMEWORKS)
        lines.append(f"| {use} | {cell} | {counts} |")
    return "\n".join(lines)


MEMBERS_CODE = (
    "from roll_device.platforms import Platform\n"
    "names = set(dir(Platform))\n"
    "for cls in Platform.__mro__:\n"
    "    names |= set(getattr(cls, '__annotations__', {}))\n"
    "print(' '.join(sorted(n for n in names if not n.startswith('_'))))\n"
)


def platform_members(source_root: Path) -> set[str]:
    """The public members (class attributes and annotated identity included) of the `Platform`
    in the checkout at `source_root`: this one, or another to measure it before a change."""
    out = subprocess.run(
        [sys.executable, "-c", MEMBERS_CODE],
        cwd=source_root,
        env={"PYTHONPATH": str(source_root)},
        check=True,
        capture_output=True,
        text=True,
    )
    return set(out.stdout.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument(
        "--platform-root", type=Path, default=ROOT, help="checkout whose Platform is measured"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/porting.md alone")
    args = parser.parse_args()
    body = render(count(args.mirrors, platform_members(args.platform_root)))
    print(body)
    if not args.no_write:
        replace_section(DOC, "device-needs", body)


if __name__ == "__main__":
    main()
