"""Rollout strategies: `vllm` (vllm.py, engine arguments per kind in vllm_args.py, worker
extension in vllm_worker.py) and `hf` (hf.py, transformers with a static KV cache and
graph-captured decoding). strategies/registry.py lists them."""
