"""Rollout strategies; importing this package registers them: `vllm` (vllm.py, engine arguments
per kind in vllm_args.py, worker extension in vllm_worker.py) and `hf` (hf.py, transformers with
a static KV cache and graph-captured decoding)."""

from strategies.inference import hf, vllm  # noqa: F401  (registers)
