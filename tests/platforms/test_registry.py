"""Detection, the ROLL_DEVICE override, plugins, and the errors for bad requests."""

import pytest
import torch

import roll_device as rd
from roll_device.errors import ConfigError, DeviceUnavailableError, MissingPackageError, UnknownDeviceError
from roll_device.platforms import registry
from roll_device.platforms.cuda import CudaPlatform
from roll_device.platforms.rocm import RocmPlatform
from tests.isolated import run_isolated
from tests.platforms.detection_checks import write_stand_in


def test_auto_detects_cpu_on_this_machine():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: auto picks it")
    assert rd.current_platform().kind == "cpu"


def test_current_platform_is_resolved_once(monkeypatch):
    first = rd.current_platform()
    monkeypatch.setenv("ROLL_DEVICE", "npu-sim")  # too late: already resolved
    assert rd.current_platform() is first


def test_override_to_cpu(monkeypatch):
    monkeypatch.setenv("ROLL_DEVICE", "CPU ")
    assert rd.current_platform().kind == "cpu"


def test_unknown_roll_device_lists_valid_kinds(monkeypatch):
    monkeypatch.setenv("ROLL_DEVICE", "tpu")
    with pytest.raises(UnknownDeviceError) as err:
        rd.current_platform()
    message = str(err.value)
    assert "unknown device kind 'tpu'" in message
    for kind in ("cuda", "rocm", "npu", "cpu", "npu-sim", "auto"):
        assert kind in message


def test_get_platform_unknown_kind():
    with pytest.raises(
        UnknownDeviceError,
        match=r"valid kinds are npu, cuda, rocm, cpu \(ROLL_DEVICE also takes auto, npu-sim\)",
    ):
        rd.get_platform("gpu")


def test_npu_without_torch_npu_names_the_package(monkeypatch):
    monkeypatch.setenv("ROLL_DEVICE", "npu")
    with pytest.raises(DeviceUnavailableError, match="torch_npu.*docs/install.md.*npu-sim"):
        rd.current_platform()
    with pytest.raises(MissingPackageError, match="needs the package torch_npu"):
        rd.get_platform("npu").device_count()


@pytest.mark.parametrize("kind", ["cuda", "rocm"])
def test_gpu_kind_without_gpu_says_what_to_install(monkeypatch, kind):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    monkeypatch.setenv("ROLL_DEVICE", kind)
    with pytest.raises(DeviceUnavailableError, match=f"no {kind} device.*docs/install.md"):
        rd.current_platform()


@pytest.mark.parametrize("variant", ["broken_import", "available_raises", "no_device"])
def test_broken_torch_npu_ends_in_a_clean_decision(tmp_path, variant):
    stand_in = write_stand_in(str(tmp_path), variant)
    result = run_isolated("tests.platforms.detection_checks:detect", env={"PYTHONPATH": f"{stand_in}:."})
    assert result["npu_available"] is False
    assert result["kind"] in ("cpu", "cuda", "rocm")


def test_broken_torch_npu_with_explicit_npu_request_explains(tmp_path):
    stand_in = write_stand_in(str(tmp_path), "available_raises")
    result = run_isolated(
        "tests.platforms.detection_checks:detect",
        env={"PYTHONPATH": f"{stand_in}:.", "ROLL_DEVICE": "npu"},
    )
    assert result["error"].startswith("DeviceUnavailableError") and "torch_npu" in result["error"]


@pytest.mark.parametrize(
    "cuda_version, hip_version, cuda_wins, rocm_wins",
    [("12.8", None, True, False), (None, "6.4", False, True), (None, None, False, False)],
)
def test_cuda_and_rocm_told_apart(monkeypatch, cuda_version, hip_version, cuda_wins, rocm_wins):
    monkeypatch.setattr(torch.version, "cuda", cuda_version)
    monkeypatch.setattr(torch.version, "hip", hip_version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert CudaPlatform.is_available() is cuda_wins
    assert RocmPlatform.is_available() is rocm_wins


def test_gpu_probe_that_raises_is_not_available(monkeypatch):
    def boom():
        raise RuntimeError("driver crashed")

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", boom)
    assert CudaPlatform.is_available() is False


PLUGIN = '''
from roll_device.platforms.cpu import CpuPlatform

class FakeAccelPlatform(CpuPlatform):
    """Test plugin: a CPU under another kind name."""
    kind = "fakeaccel"

    @classmethod
    def is_available(cls):
        return True
'''


def _install_plugin(tmp_path, monkeypatch, body, module, cls="FakeAccelPlatform"):
    (tmp_path / f"{module}.py").write_text(body)
    dist = tmp_path / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[roll_device.platforms]\n{module} = {module}:{cls}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.reset_for_tests()


def test_plugin_platform_is_detected_first_and_reachable_by_kind(tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, PLUGIN, "fakeaccel_plugin_good")
    assert "fakeaccel" in rd.known_kinds()
    assert rd.current_platform().kind == "fakeaccel"
    assert rd.get_platform("fakeaccel").dist_backend == "gloo"


def test_broken_plugin_is_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    _install_plugin(
        tmp_path, monkeypatch, "raise ImportError('plugin needs libfoo')\n", "fakeaccel_plugin_broken"
    )
    assert rd.current_platform().kind in ("cpu", "cuda", "rocm")
    assert "fakeaccel" in caplog.text and "libfoo" in caplog.text


OTHER_PLUGIN = PLUGIN.replace("FakeAccelPlatform", "OtherAccelPlatform").replace(
    '"fakeaccel"', '"otheraccel"'
)


def test_two_plugins_with_devices_are_an_error_naming_both(tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, PLUGIN, "fakeaccel_a")
    _install_plugin(tmp_path, monkeypatch, OTHER_PLUGIN, "otheraccel_b", cls="OtherAccelPlatform")
    with pytest.raises(ConfigError) as err:
        rd.current_platform()
    assert str(err.value) in (
        f"platform plugins for kinds {a}, {b} all report usable devices here: choose one with "
        f"ROLL_DEVICE={a} or ROLL_DEVICE={b}"
        for a, b in (("fakeaccel", "otheraccel"), ("otheraccel", "fakeaccel"))
    )
    monkeypatch.setenv("ROLL_DEVICE", "otheraccel")
    assert rd.current_platform().kind == "otheraccel", "ROLL_DEVICE settles it"


def test_two_plugins_of_one_kind_are_an_error(tmp_path, monkeypatch):
    _install_plugin(tmp_path, monkeypatch, PLUGIN, "fakeaccel_a")
    _install_plugin(tmp_path, monkeypatch, PLUGIN, "fakeaccel_b")
    with pytest.raises(
        ConfigError,
        match="platform plugins 'fakeaccel_.:FakeAccelPlatform' and "
        "'fakeaccel_.:FakeAccelPlatform' both register device kind 'fakeaccel': uninstall one",
    ):
        rd.known_kinds()


def test_where_the_platform_was_resolved_is_remembered(monkeypatch, caplog):
    assert registry.resolved_at() is None
    first = rd.current_platform()
    assert registry.resolved_at().startswith(f"{__file__}:")
    assert registry.resolved_at().endswith("in test_where_the_platform_was_resolved_is_remembered")
    monkeypatch.setenv("ROLL_DEVICE", "npu-sim")
    assert rd.current_platform() is first
    assert "ROLL_DEVICE is now 'npu-sim'" in caplog.text and registry.resolved_at() in caplog.text


@pytest.mark.parametrize(
    ("kind", "hint"),
    [
        ("npu", "no usable Ascend NPU: install torch_npu"),
        ("cuda", "no cuda device is visible to this torch"),
        ("rocm", "no rocm device is visible to this torch"),
    ],
)
def test_each_platform_class_gives_its_own_unavailable_hint(kind, hint):
    assert type(rd.get_platform(kind)).unavailable_hint().startswith(hint)
