"""A run's JSON-lines file: one record a line, each with the `step` it belongs to, kept to the
steps the run holds (a resumed run drops what its predecessor wrote after the checkpoint, a new
run what an earlier run left in its directory)."""

from __future__ import annotations

import json
from pathlib import Path


class JsonLines:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, *records: dict) -> None:
        with self.path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (written after the checkpoint a resumed run starts from)."""
        kept = [r for r in self.read() if r["step"] <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def clear(self) -> None:
        """Drop every record (a new run in a directory an earlier run wrote to)."""
        self.path.write_text("")
