"""The device-neutral rule: vendor names appear only in platforms/, sim/ and compat/, and nothing
above them keeps a table of vendors: no concrete platform class or module, no list of the
built-in kinds, no kind name of a vendor as a key. Above the platform layer a kind is a string
from the registry and its facts are members of its `Platform`."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = ("roll_device/platforms/", "roll_device/sim/", "roll_device/compat/")
FORBIDDEN = re.compile(r"""torch\.cuda|\.cuda\(|["']cuda["']|["']nccl["']|torch\.npu|["']hccl["']""")
VENDOR_TABLES = re.compile(
    r"""\b(Cpu|Cuda|Rocm|Npu)Platform\b|roll_device\.platforms\.(cpu|cuda|rocm|npu)\b"""
    r"""|\b(BUILTIN|DETECTION_ORDER)\b|["'](rocm|npu|npu-sim)["']"""
)


def leaks(root: Path = ROOT) -> list[str]:
    found = []
    for top in ("roll_device", "strategies"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(ALLOWED):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if FORBIDDEN.search(line) or VENDOR_TABLES.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_vendor_names_outside_platform_layer():
    assert leaks() == [], "route these through the platform:\n" + "\n".join(leaks())


def test_rule_catches_a_leak(tmp_path):
    (tmp_path / "roll_device" / "pipeline").mkdir(parents=True)
    (tmp_path / "strategies").mkdir()
    (tmp_path / "roll_device" / "pipeline" / "bad.py").write_text('x = t.to("cuda")\n')
    (tmp_path / "strategies" / "bad.py").write_text("torch.npu.synchronize()\n")
    (tmp_path / "roll_device" / "platforms").mkdir()
    (tmp_path / "roll_device" / "platforms" / "ok.py").write_text('backend = "nccl"\n')
    assert [line.split(":")[0] for line in leaks(tmp_path)] == [
        "roll_device/pipeline/bad.py",
        "strategies/bad.py",
    ]


def test_rule_catches_a_class_keyed_vendor_table(tmp_path):
    (tmp_path / "strategies").mkdir()
    (tmp_path / "roll_device").mkdir()
    (tmp_path / "strategies" / "profiles.py").write_text(
        "from roll_device.platforms.npu import NpuPlatform\n"
        "PROFILES = {NpuPlatform.kind: 1}\n"
        "OTHER = {'rocm': 2}\n"
        "from roll_device.platforms.registry import DETECTION_ORDER as KINDS\n"
        "from roll_device.platforms import HOST_KIND, get_platform\n"
    )
    assert [line.split(":")[1] for line in leaks(tmp_path)] == ["1", "2", "3", "4"]


HOST_CHECK = re.compile(r"""[!=]=\s*["']cpu["']|["']cpu["']\s*[!=]=""")


def host_checks(root: Path = ROOT) -> list[str]:
    """Comparisons with the string "cpu" in strategies/: whether a platform is the host is its
    `is_host`, whether a tensor lives in host memory its `is_cpu`."""
    return [
        f"{path.relative_to(root).as_posix()}:{number}: {line.strip()}"
        for path in sorted((root / "strategies").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HOST_CHECK.search(line)
    ]


def test_strategies_ask_the_platform_whether_it_is_the_host():
    assert host_checks() == [], "ask platform.is_host or tensor.is_cpu:\n" + "\n".join(host_checks())


def test_host_rule_catches_a_comparison(tmp_path):
    (tmp_path / "strategies").mkdir()
    (tmp_path / "strategies" / "bad.py").write_text('pin = platform.device_type != "cpu"\n')
    assert host_checks(tmp_path) == ['strategies/bad.py:1: pin = platform.device_type != "cpu"']
