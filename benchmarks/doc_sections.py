"""docs/benchmarks.md holds one section per benchmark script between `<!-- name:begin -->` and
`<!-- name:end -->`; `replace_section` rewrites one script's section and leaves the others. A
script's first section goes after the others, before the measurements log that ends the file.
`save_results` writes a script's measurements and their summary to its results/ file."""

from __future__ import annotations

import json
from pathlib import Path

HEADER = "# Benchmarks\n\nMeasured comparisons; each section is written by its script.\n"
LOG = "## Measurements log"  # dated history, kept by hand at the end


def replace_section(doc: Path, name: str, body: str) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = "\n".join([begin, body.strip("\n"), end])
    text = doc.read_text() if doc.exists() else HEADER
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    elif LOG in text:
        head, log = text.split(LOG, 1)
        text = head.rstrip("\n") + "\n\n" + section + "\n\n" + LOG + log
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text)


def save_results(path: Path, results: dict, summary: dict) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"results": results, "summary": summary}, indent=1, default=str))
