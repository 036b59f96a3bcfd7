"""Observability of a run (docs/observability.md): trackers by name (`logger: [...]`), each role's
memory per phase, and per-role profiling through the platform's profiler.

- `settings.py`: the `tracking` and `profile` sections and the `logger` list's check;
- `registry.py`: the tracker registry (`TRACKERS`), the `Tracker` base and `Trackers`, what
  every backend is given (`scalars`), the tracker runs a resumed run continues (`trackers.json`);
- `backends.py`: console, tensorboard, wandb, mlflow, swanlab, one small class each;
- `phases.py`: a worker's phases (rollout, logprobs, update, sync, turns, reward) as platform
  ranges, with the memory read after each;
- `profiler.py`: a worker's profile of the chosen steps, one Chrome trace per worker and step;
- `memory.py`: the memory readings, their metrics keys and `memory.png`.

Nothing here imports the pipeline: the run (roll_device/pipeline/) calls it.
"""
