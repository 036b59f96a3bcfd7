"""Megatron's parallel state (`megatron.core.parallel_state`) is process-wide: the Megatron
trainers of one process (a policy and its reference) share one layout, the first one in makes the
groups, the last one out destroys them."""

from __future__ import annotations

from roll_device.errors import ConfigError

_parallel_users = {"count": 0}  # trainers in this process sharing megatron's parallel_state


def join_parallel_state(tp: int, pp: int, ep: int, etp: int) -> None:
    """Megatron's groups for the layout, made on the world's backend (the platform's): the
    expert-parallel ones are those the all-to-all dispatcher exchanges tokens over."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
            parallel_state.get_expert_tensor_parallel_world_size(),
        )
        if current != (tp, pp, ep, etp):
            raise ConfigError(
                "another Megatron trainer in this process uses tensor, pipeline, expert and expert tensor "
                f"parallel sizes {current}; this one asks for {(tp, pp, ep, etp)}: use one layout per process"
            )
    else:
        parallel_state.initialize_model_parallel(
            tp, pp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp
        )
    _parallel_users["count"] += 1


def leave_parallel_state() -> None:
    from megatron.core import parallel_state

    _parallel_users["count"] -= 1
    if _parallel_users["count"] == 0:
        parallel_state.destroy_model_parallel()
