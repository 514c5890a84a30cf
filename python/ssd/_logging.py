"""The C++ core's log records, forwarded to the ``ssd`` logger.

The core queues its records (decisions it makes on its own: fallback
switches, partial speculation trees, fan-out budget changes, preemptions);
``LLM`` forwards them from its own thread whenever it talks to the engine, so
no engine thread ever waits for the GIL. Silent by default: the ``ssd``
logger has a NullHandler, and the core drops records below the logger's
effective level before formatting them. To see the decisions:

    logging.basicConfig()
    logging.getLogger("ssd").setLevel(logging.INFO)
"""
from __future__ import annotations

import logging

LOGGER = logging.getLogger("ssd")
LOGGER.addHandler(logging.NullHandler())


def sync_level(core) -> None:
    """Tells the core (the ``ssd._C`` module) the ``ssd`` logger's effective level."""
    core.set_log_level(LOGGER.getEffectiveLevel())


def forward(core) -> None:
    """Hands the core's queued records to the ``ssd`` logger, then re-syncs the level.

    ``core`` is passed in rather than imported, so that this also works while
    the interpreter shuts down (an LLM collected then still drains its log).
    """
    for level, message in core.drain_log():
        LOGGER.log(level, message)
    sync_level(core)
