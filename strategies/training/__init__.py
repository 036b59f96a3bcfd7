"""Training strategies; importing this package registers them (megatron-core itself is imported
only when a Megatron trainer initializes)."""

from strategies.training import fsdp  # noqa: F401  (registers "fsdp")
