"""`roll-device export` of a LoRA checkpoint (the FSDP trainer with `trainer.lora`): its adapter
as PEFT saves one (`adapter_model.safetensors` + `adapter_config.json`, for PEFT's
`PeftModel.from_pretrained` or vLLM's `LoRARequest`), or with `--merge` the model with the adapter
merged into its weights (`merge_and_unload`), an ordinary Hugging Face model directory.

The checkpoint holds the wrapped model's tensors (the base under PEFT's names, the adapters) and
the adapter's config, written beside them by the trainer (strategies/training/lora.py).
"""

from __future__ import annotations

from pathlib import Path

from roll_device.files import give_ordinary_mode


def write_adapter(checkpoint: Path, state: dict, base: str, out: Path, merge: bool) -> int:
    """Write the adapter of `checkpoint` (its tensors `state`, of the model at `base`) into `out`,
    or with `merge` the merged model."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from strategies.training.lora import is_adapter, saved_name

    config = LoraConfig.from_pretrained(str(checkpoint))
    base_state = {saved_name(k): t for k, t in state.items() if not is_adapter(k)}
    adapters = {saved_name(k): t for k, t in state.items() if is_adapter(k)}
    model = AutoModelForCausalLM.from_pretrained(base, dtype=next(iter(state.values())).dtype)
    model.load_state_dict(base_state, strict=False)
    wrapped = get_peft_model(model, config)
    set_peft_model_state_dict(wrapped, adapters)
    if merge:
        with torch.no_grad():
            wrapped.merge_and_unload().save_pretrained(out, safe_serialization=True)
        what = f"{len(adapters)} adapter tensors merged into the model of {base}"
    else:
        wrapped.save_pretrained(out)
        what = f"the adapter ({len(adapters)} tensors) on {base}"
    give_ordinary_mode(sorted(out.glob("*.safetensors")))
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    print(f"exported {checkpoint}: {what}, to {out}")
    return 0
