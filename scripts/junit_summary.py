"""One line per test case of a pytest JUnit XML report: `check <test>: passed|FAILED|skipped (why)`.

python scripts/junit_summary.py REPORT.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def lines(report: str) -> list[str]:
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, detail = "passed", f"{float(case.get('time', 0)):.1f}s"
        for tag, word in (("failure", "FAILED"), ("error", "FAILED"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                outcome = word
                detail = (found.get("message") or "").splitlines()[0][:160] if found.get("message") else tag
        out.append(f"check {name}: {outcome} ({detail})")
    return out


if __name__ == "__main__":
    print("\n".join(lines(sys.argv[1])))
