"""STAND-IN for `mindspeed.megatron_adaptor`: records that it was imported and whether megatron
was already imported then, and records each `repatch(options)` call. Not MindSpeed."""

import os
import sys

from mindspeed import EVENTS


def _megatron_imported() -> bool:
    return any(m == "megatron" or m.startswith("megatron.") for m in sys.modules)


EVENTS.append(("import megatron_adaptor", _megatron_imported()))


class StandInStop(Exception):
    """Raised by repatch when MINDSPEED_STANDIN_STOP is set, to end a test after the glue ran."""


def repatch(options):
    EVENTS.append(("repatch", _megatron_imported(), dict(options)))
    if os.environ.get("MINDSPEED_STANDIN_STOP"):
        raise StandInStop("stand-in stops after repatch")
