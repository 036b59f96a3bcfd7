"""A small arithmetic dataset in GSM8K's format, made locally (no download): one JSON line per
problem, `{"question": "what is 3+4?", "answer": "3+4=7\\n#### 7"}` (the worked solution, then
`####` and the final answer, as GSM8K writes it).

The problems are every sum and difference of single digits whose result is a single digit
(110 problems), so the tiny character-level model can answer in one token; a seeded permutation
splits them into `train.jsonl` and `test.jsonl`. `data.generate=arithmetic` makes them at
`data.path` / `data.eval_path` when absent.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TEST_SIZE = 20


def problems() -> list[dict[str, str]]:
    rows = []
    for a in range(10):
        for b in range(10):
            for op, value in (("+", a + b), ("-", a - b)):
                if 0 <= value <= 9:
                    rows.append(
                        {"question": f"what is {a}{op}{b}?", "answer": f"{a}{op}{b}={value}\n#### {value}"}
                    )
    return rows


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text("".join(json.dumps(row) + "\n" for row in rows))
    staging.rename(path)  # a reader never sees half a file


def make_arithmetic_dataset(train_path: str | Path, test_path: str | Path, seed: int = 0) -> None:
    """Write the training and test files unless both exist."""
    train_path, test_path = Path(train_path), Path(test_path)
    if train_path.exists() and test_path.exists():
        return
    rows = problems()
    random.Random(f"arithmetic:{seed}").shuffle(rows)
    _write(test_path, rows[:TEST_SIZE])
    _write(train_path, rows[TEST_SIZE:])


GENERATORS = {"arithmetic": make_arithmetic_dataset}
