"""Detection checks that must run in a process of their own (they import stand-in modules).

The `torch_npu` modules written here are stand-ins for a package that cannot be installed on
this machine; they exist only to drive the detection glue and never count as NPU support.
"""

from __future__ import annotations

import json
import os


def detect(_stand_in_dir: str = "") -> dict:
    import roll_device as rd
    from roll_device.platforms.npu import NpuPlatform

    result = {"npu_available": NpuPlatform.is_available()}
    try:
        result["kind"] = rd.current_platform().kind
    except Exception as exc:  # noqa: BLE001 - the test asserts on the message
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["roll_device"] = os.environ.get("ROLL_DEVICE", "")
    return result


STAND_INS = {
    # torch_npu whose import fails the way it does without the CANN libraries
    "broken_import": "raise ImportError('libhccl.so: cannot open shared object file')\n",
    # torch_npu that imports, but whose is_available() raises (a CPU-only head node)
    "available_raises": (
        "import types, torch\n"
        "def _boom():\n"
        "    raise RuntimeError('drvGetDevNum failed: no NPU on this host')\n"
        "torch.npu = types.SimpleNamespace(is_available=_boom, device_count=lambda: 0)\n"
    ),
    # torch_npu that imports and honestly reports no device
    "no_device": (
        "import types, torch\n"
        "torch.npu = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)\n"
    ),
}


def write_stand_in(directory: str, variant: str) -> str:
    package = os.path.join(directory, "torch_npu")
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write("# stand-in for torch_npu (not installable here): drives detection glue only\n")
        f.write(STAND_INS[variant])
    return directory


if __name__ == "__main__":
    print(json.dumps(detect()))
