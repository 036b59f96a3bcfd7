"""Backends behind device-neutral interfaces: rollout engines (`inference/`: vLLM, transformers)
and trainers (`training/`: FSDP2, Megatron-core), each a class of `base.py`'s `InferenceStrategy` or
`TrainStrategy`, registered by (role type, name) in `registry.py` and resolved lazily by qualified
name for a role on a device kind (docs/extending.md adds one)."""
