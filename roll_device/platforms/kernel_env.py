"""`platform.kernels`: the kernel libraries of the kind and the toolkit they come with: the variables
that name the architectures extensions are built for and how the runtime loads kernel modules, the
attention backend Transformer Engine is told to use (and the one the environment selects), the SMs
its layer norms leave to communication, the switch of the kind's deep-learning primitives library
(cuDNN, MIOpen, oneDNN), and where the kind's toolkit lives (`CUDA_HOME`, `ROCM_PATH`, CANN's home).

Values are per kind, set as class attributes of each kind's `kernels` group; a kind without the library (no
Transformer Engine on the NPU and the CPU) returns nothing for the default and fails loudly, naming
the member, when asked for something else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from roll_device.platforms.groups import PlatformGroup

# Transformer Engine's attention backends, by the variable that switches each one on.
ATTENTION_SWITCHES = {"flash": "NVTE_FLASH_ATTN", "fused": "NVTE_FUSED_ATTN", "unfused": "NVTE_UNFUSED_ATTN"}
LOCAL_ATTENTION = "local"  # every Transformer Engine backend off: Megatron's own attention
AUTO_ATTENTION = "auto"  # Transformer Engine chooses
LAYERNORM_SM_MARGIN_VARS = ("NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_BWD_LAYERNORM_SM_MARGIN")


class Kernels(PlatformGroup):
    """The kernels group; kinds name a subclass that sets the class attributes."""

    attribute = "kernels"
    # The variable naming the architectures torch's extension builder compiles for.
    kernel_arch_var: ClassVar[str | None] = None
    # The variable that makes the runtime load kernel modules lazily (the value for lazy, eager).
    module_loading_var: ClassVar[tuple[str, str, str] | None] = None
    # Whether Transformer Engine (and its NVTE_* switches) runs on this kind.
    has_transformer_engine: ClassVar[bool] = False
    # Where the kind's toolkit lives: the variables that name its home, first set wins, then the
    # install defaults that exist.
    toolkit_home_envs: ClassVar[tuple[str, ...]] = ()
    toolkit_default_homes: ClassVar[tuple[str, ...]] = ()

    def toolkit_home(self) -> str | None:
        """The directory of the kind's toolkit here (CUDA's, ROCm's as `ROCM_PATH` names it,
        CANN's), or None when it is not installed or the kind has no toolkit of its own."""
        for name in self.toolkit_home_envs:
            if os.environ.get(name):
                return os.environ[name]
        return next((home for home in self.toolkit_default_homes if Path(home).is_dir()), None)

    def kernel_arch(self, index: int | None = None) -> str:
        """The architecture name the kind's extension builder takes for device `index`."""
        return self.platform.facts.device_arch(index)

    def kernel_build_env(self, index: int | None = None) -> dict[str, str]:
        """Variables that make extensions built here compile for device `index`'s architecture
        (`TORCH_CUDA_ARCH_LIST=9.0` on an H100); empty where the builder takes none."""
        if self.kernel_arch_var is None:
            return {}
        return {self.kernel_arch_var: self.kernel_arch(index)}

    def module_loading_env(self, lazy: bool = True) -> dict[str, str]:
        """Variables that make the runtime load kernel modules lazily (at first launch) or eagerly;
        empty where the runtime has no such switch."""
        if self.module_loading_var is None:
            return {}
        var, lazy_value, eager_value = self.module_loading_var
        return {var: lazy_value if lazy else eager_value}

    def _require_transformer_engine(self, member: str) -> None:
        if not self.has_transformer_engine:
            self._unsupported(member, "Transformer Engine does not run on this kind")

    def attention_backend_env(self, backend: str) -> dict[str, str]:
        """Variables that make Transformer Engine use attention `backend` ("flash", "fused",
        "unfused"; "local": none of them, Megatron's own; "auto": Transformer Engine chooses)."""
        if backend not in (*ATTENTION_SWITCHES, LOCAL_ATTENTION, AUTO_ATTENTION):
            known = (*ATTENTION_SWITCHES, LOCAL_ATTENTION, AUTO_ATTENTION)
            raise ValueError(
                f"platform '{self.platform.name}': attention backend '{backend}' is not one of {known}"
            )
        if backend == AUTO_ATTENTION:
            return {}
        self._require_transformer_engine("attention_backend_env")
        return {var: "1" if name == backend else "0" for name, var in ATTENTION_SWITCHES.items()}

    def attention_backend(self, env: Mapping[str, str] | None = None) -> str:
        """The attention backend `env` (default: this process's) selects, as `attention_backend_env`
        names it: "local" when every switch is 0, a backend when it is 1 and another is 0, else
        "auto" (always "auto" where Transformer Engine does not run)."""
        env = os.environ if env is None else env
        if not self.has_transformer_engine:
            return AUTO_ATTENTION
        values = {name: env.get(var) for name, var in ATTENTION_SWITCHES.items()}
        if all(v == "0" for v in values.values()):
            return LOCAL_ATTENTION
        for name, value in values.items():
            others = [v for other, v in values.items() if other != name]
            if value == "1" and "0" in others:
                return name
        return AUTO_ATTENTION

    def sm_margin_env(self, backward: int = 0, forward: int = 0) -> dict[str, str]:
        """Variables that make Transformer Engine's layer norms leave `forward` / `backward`
        streaming multiprocessors to overlapping communication. Zero margins need nothing where
        Transformer Engine does not run; others fail loudly there."""
        if backward < 0 or forward < 0:
            raise ValueError(
                f"platform '{self.platform.name}': SM margins must not be negative ({forward}, {backward})"
            )
        if not self.has_transformer_engine:
            if backward or forward:
                self._unsupported("sm_margin_env", "Transformer Engine does not run on this kind")
            return {}
        return dict(zip(LAYERNORM_SM_MARGIN_VARS, (str(forward), str(backward)), strict=True))

    def set_dnn_library_enabled(self, enabled: bool) -> None:
        """Switch the kind's deep-learning primitives library (cuDNN; MIOpen on ROCm, behind the
        same switch; oneDNN on the CPU) on or off in this process."""
        self._unsupported(
            "set_dnn_library_enabled", "no deep-learning primitives library switch on this kind"
        )
