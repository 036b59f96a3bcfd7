"""Where a step's weight sync went, from both ends' stats: one record for the step.

The senders' stats (one per sending trainer rank) merge into one sync (bytes added up; seconds,
export and cast the slowest rank's, as the ranks send at once); the engines' load is the slowest
engine's. Split: `export_s` (the trainer's export: gathers where rank 0 sends the whole model;
casts included where the export casts), `cast_s` (casts to the engine's dtype timed apart: the
sharded export), `load_s` (the engines loading), `transfer_s` (the senders' seconds less export
and load: moving bytes, waiting for receivers); the step record adds the Ray calls around them
(`sync_calls_s`, record.py).
"""

from __future__ import annotations

SENT = ("version", "path", "transport", "adapters_only")


def sync_split(senders: list[dict], engines: list[dict]) -> dict:
    """One sync's stats from its senders' (`SyncStats` as dicts, with `cast_s` where timed) and
    engines' (with `load_s`)."""
    seconds = max(s["seconds"] for s in senders)
    export_s = max(s["export_s"] for s in senders)
    cast_s = max(s.get("cast_s", 0.0) for s in senders)
    load_s = max((e.get("load_s", 0.0) for e in engines), default=0.0)
    return {
        **{key: senders[0][key] for key in SENT},
        "senders": len(senders),
        "buckets": sum(s["buckets"] for s in senders),
        "tensors": sum(s["tensors"] for s in senders),
        "nbytes": sum(s["nbytes"] for s in senders),
        "seconds": seconds,
        "export_s": export_s,
        "cast_s": cast_s,
        "load_s": load_s,
        "transfer_s": max(seconds - export_s - cast_s - load_s, 0.0),
    }
