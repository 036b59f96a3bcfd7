"""Training strategies: `fsdp` (FSDP2) and `megatron` (megatron-core, imported only when a Megatron
trainer initializes). strategies/registry.py lists them."""
