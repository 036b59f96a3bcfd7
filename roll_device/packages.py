"""Packages as platforms and strategies declare them: the module they import, the distribution
that provides it, and the release rules between distributions.

Declarations only: nothing here imports the packages it names (the doctor reads installed
versions with `importlib.metadata`). `release_parts(version, n)` compares releases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Package:
    """One package a platform or strategy needs.

    `conflicts`: other distributions that install the same module (a build for another kind);
    at most one of them and `distribution` may be installed.
    `matches`: (distribution, parts): this one is released in lockstep with that one and must
    equal it in the first `parts` release numbers (2: major.minor).
    """

    module: str
    distribution: str
    conflicts: tuple[str, ...] = ()
    matches: tuple[str, int] | None = None


def release_parts(version: str, parts: int) -> tuple[int, ...]:
    """The first `parts` release numbers of `version` ("2.5.1.post3" -> (2, 5) for parts=2;
    "0.11.0rc1" -> (0, 11, 0) for parts=3); local labels and pre-release tags are ignored."""
    numbers = []
    for piece in version.split("+")[0].split(".")[:parts]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def local_label(version: str) -> str:
    """The build label after `+` ("2.13.0+cpu" -> "cpu"), or "" for a plain release."""
    return version.partition("+")[2]
