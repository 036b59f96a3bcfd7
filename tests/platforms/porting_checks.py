"""The worked example of docs/porting.md, run in a process of its own (it sets environment
variables and a process group): on the CPU, or on the simulated NPU when ROLL_DEVICE=npu-sim."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

PORTING = Path(__file__).resolve().parents[2] / "docs" / "porting.md"


def example_source() -> str:
    """The code block that follows `<!-- example:after -->` in docs/porting.md."""
    after = PORTING.read_text().split("<!-- example:after -->", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.DOTALL).group(1)


def run_example() -> dict:
    namespace: dict = {}
    exec(compile(example_source(), str(PORTING), "exec"), namespace)  # noqa: S102 - our own docs
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        loss = namespace["train"]()
    import roll_device as rd

    p = rd.current_platform()
    return {
        "platform": p.name,
        "loss": loss,
        "printed": printed.getvalue().strip(),
        "env": {k: os.environ.get(k) for k in {**p.env.training_env(), **p.collective_env(timeout_s=1)}},
    }
