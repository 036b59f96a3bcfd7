"""The device's graph budget, one rule for every engine: how many graphs a set of capture sizes
costs, and sizes fitted to a platform's `graph_budget` (None: no limit).

Each captured graph holds device resources until it is released; on an Ascend NPU a graph takes
at least one of the device's streams, so vLLM-Ascend caps the graphs at 1,800 of about 2,048.
vLLM's engine arguments (`strategies/inference/vllm_args.py`) and the HF strategy's decode graphs
(`strategies/inference/hf.py`) both size their capture sizes here.
"""

from __future__ import annotations

from roll_device.errors import ConfigError


def graphs_per_size(mode: str, num_layers: int) -> int:
    """Device graphs one capture size costs in vLLM graph mode `mode`: a full graph is one;
    piecewise splits the model at each attention layer (layers + 1 pieces); FULL_AND_PIECEWISE
    captures both."""
    return {
        "NONE": 0,
        "FULL": 1,
        "FULL_DECODE_ONLY": 1,
        "PIECEWISE": num_layers + 1,
        "FULL_AND_PIECEWISE": num_layers + 2,
    }[mode]


def fit_capture_sizes(
    sizes: list[int],
    per_size: int,
    budget: int | None,
    *,
    explicit: bool,
    key: str,
    mode: str | None = None,
    fewer_graphs: str = "use graph_mode=FULL_DECODE_ONLY",
) -> list[int]:
    """`sizes` (ascending) within `budget` graphs at `per_size` graphs a size.

    Derived sizes are thinned: at most budget // per_size, spread evenly, always keeping the
    largest. Sizes the user listed (`explicit`) are never changed: over the budget they raise
    `ConfigError` naming `key`, the count and the fix. `mode`: the vLLM graph mode, if any;
    `fewer_graphs`: the setting that costs fewer graphs per size, offered in the errors."""
    if budget is None:
        return sizes
    room = budget // per_size
    if room < 1:
        raise ConfigError(
            f"{f'graph_mode={mode}' if mode else key} needs {per_size} graphs for a single capture size, "
            f"over the device's budget of {budget}: {fewer_graphs}"
        )
    if len(sizes) <= room:
        return sizes
    if explicit:
        with_mode = f" with graph_mode={mode}" if mode else ""
        alternative = f" or {fewer_graphs}" if per_size > 1 else ""
        raise ConfigError(
            f"{key} {sizes}{with_mode} need {per_size * len(sizes)} graphs ({per_size} per size), over "
            f"the device's budget of {budget}: list at most {room} sizes{alternative}"
        )
    rest = sizes[:-1]
    step = len(rest) / (room - 1) if room > 1 else 0
    kept = [rest[int(i * step)] for i in range(room - 1)]
    return sorted(set(kept)) + [sizes[-1]]
