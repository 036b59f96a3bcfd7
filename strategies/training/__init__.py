"""Training strategies; importing this package registers them (megatron-core itself is imported
only when a Megatron trainer initializes)."""

from strategies.training import fsdp, megatron  # noqa: F401  (register "fsdp" and "megatron")
