"""`roll-device make-tiny-model PATH [--shapes tiny|qwen2.5-0.5b|qwen2.5-1.5b] [--layers N] [--hidden N]`:
write the tiny Qwen2 model and its character tokenizer (or a randomly initialised model of a Qwen2.5
model's shapes with that tokenizer, for measurements at size)."""

from __future__ import annotations

from roll_device.errors import ConfigError
from roll_device.files import make_folder

TINY_SHAPES = "tiny"
# the Qwen2.5 shapes, as roll_device/models/qwen_shaped.py names them (not imported: it loads transformers)
QWEN_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
SHAPES = (TINY_SHAPES, *QWEN_SHAPES)


def make_model_command(path: str, shapes: str, seed: int, layers: int | None, hidden: int | None) -> int:
    make_folder(path, "make-tiny-model's PATH")
    if shapes in QWEN_SHAPES:
        from roll_device.models.qwen_shaped import make_qwen_shaped_model

        if hidden is not None:
            raise ConfigError(f"make-tiny-model: --hidden applies to the tiny shapes, not {shapes}")
        made = make_qwen_shaped_model(path, num_layers=layers, seed=seed, tokenizer=True, shapes=shapes)
        print(f"randomly initialised model of {shapes}'s shapes and a character tokenizer in {made}")
        return 0
    from roll_device.models.tiny import make_tiny_model

    sizes = {
        key: value for key, value in (("num_layers", layers), ("hidden_size", hidden)) if value is not None
    }
    made = make_tiny_model(path, seed=seed, **sizes)  # the sizes not given: make_tiny_model's own
    print(f"tiny model and tokenizer in {made}")
    return 0
