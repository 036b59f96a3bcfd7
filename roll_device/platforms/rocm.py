"""AMD GPUs through torch's ROCm build: torch calls them `cuda`, RCCL answers to `nccl`,
HIP graphs stand behind `torch.cuda.CUDAGraph`, Ray rewrites `HIP_VISIBLE_DEVICES`.
NVTX calls reach roctx; `ROCR_VISIBLE_DEVICES` narrows visibility before HIP does, so a pinned
process must not carry it."""

from __future__ import annotations

from roll_device.platforms.cuda import CudaEnv, CudaKernels, CudaPlatform
from roll_device.platforms.device_facts import DeviceFacts
from roll_device.platforms.groups import group


class RocmEnv(CudaEnv):
    """ROCR's visibility variable beside HIP's; no in-switch reductions."""

    extra_visible_devices_envs = ("ROCR_VISIBLE_DEVICES",)
    extra_ray_noset_envs = ("RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",)
    switch_reduction_var = None  # no NVLink SHARP on AMD GPUs: RCCL reduces in software


class RocmFacts(DeviceFacts):
    """GFX targets for architectures."""

    def device_arch(self, index: int | None = None) -> str:
        """The GFX target (`gfx942` on an MI300X), without feature suffixes."""
        return str(self.device_properties(index).gcnArchName).split(":")[0]


class RocmKernels(CudaKernels):
    """ROCm's extension builder and toolkit home; no lazy-loading switch."""

    kernel_arch_var = "PYTORCH_ROCM_ARCH"
    module_loading_var = None
    toolkit_home_envs = ("ROCM_PATH", "ROCM_HOME")
    toolkit_default_homes = ("/opt/rocm",)

    def kernel_arch(self, index: int | None = None) -> str:
        """`gfx942`: the form `PYTORCH_ROCM_ARCH` takes."""
        return self.platform.facts.device_arch(index)


class RocmPlatform(CudaPlatform):
    kind = "rocm"
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    ray_noset_visible_devices_env = "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"
    ray_accelerator_type_prefixes = ("AMD-",)
    allocator_conf_env = "PYTORCH_HIP_ALLOC_CONF"
    torch_build = "hip"
    env = group(RocmEnv)
    facts = group(RocmFacts)
    kernels = group(RocmKernels)
