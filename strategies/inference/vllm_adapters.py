"""A LoRA policy served by vLLM: the engine started with `enable_lora`, each sync's adapters
written by the engine's first rank as a PEFT folder (vllm_transfer.py), and served from then on
under a new `LoRARequest` (a new adapter id per version, so vLLM never serves a cached older one);
the previous adapter is removed from the engine and its folder deleted. vLLM 0.32 loads an adapter
from a path only (no tensors in memory), so the folder is a temporary one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from strategies.inference.adapters import ADAPTER_FILE
from strategies.training.settings import LoraSettings

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's `max_lora_rank` choices


class ServedAdapter:
    """The adapter a vLLM engine serves on its base, and the folders it comes from."""

    def __init__(self, lora: LoraSettings) -> None:
        self.lora = lora
        self.root = Path(tempfile.mkdtemp(prefix="roll-device-adapters-"))
        self.request = None  # the LoRARequest generations use (None: the base, before any adapter)
        self.syncs = 0

    def engine_args(self) -> dict[str, Any]:
        """vLLM's engine arguments for adapters of this rank (its smallest `max_lora_rank` above)."""
        rank = next(r for r in LORA_RANKS if r >= self.lora.rank)
        return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1}

    def next_sync(self) -> dict[str, Any]:
        """The update info of the next sync: a new folder for the adapters it carries."""
        self.syncs += 1
        return {"adapter_dir": str(self.root / f"sync-{self.syncs}"), "lora_alpha": float(self.lora.alpha)}

    def serve(self, llm, version: int) -> None:
        """Serve the adapter of the sync just received (if it carried one) from now on."""
        from vllm.lora.request import LoRARequest

        folder = self.root / f"sync-{self.syncs}"
        if not (folder / ADAPTER_FILE).is_file():
            return
        old, self.request = self.request, LoRARequest(f"policy-v{version}", self.syncs, str(folder))
        if old is not None:
            llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The served adapter's tensors (PEFT's saved names); none before the first."""
        from safetensors.torch import load_file

        return {} if self.request is None else load_file(str(Path(self.request.lora_path) / ADAPTER_FILE))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
