"""AMD GPUs through torch's ROCm build: torch calls them `cuda`, RCCL answers to `nccl`,
HIP graphs stand behind `torch.cuda.CUDAGraph`, Ray rewrites `HIP_VISIBLE_DEVICES`."""

from __future__ import annotations

from roll_device.platforms.cuda import CudaPlatform


class RocmPlatform(CudaPlatform):
    kind = "rocm"
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    ray_noset_visible_devices_env = "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"
    ray_accelerator_type_prefixes = ("AMD-",)
    allocator_conf_env = "PYTORCH_HIP_ALLOC_CONF"
    torch_build = "hip"
