"""Adapters for third-party code that hard-codes CUDA: megatron-core on the CPU (redirects) and on
Ascend NPUs (MindSpeed). The only place besides platforms/ and sim/ that names vendors."""
