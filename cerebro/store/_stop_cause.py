"""Why a run stopped before its end, as its ``run_interrupted`` line says: what ``cb.load``
and ``cerebro status`` tell a user, who resumes it the same way whatever the cause."""
from __future__ import annotations

import enum


class StopCause(enum.StrEnum):
    """What stopped a run at its trials' epoch boundaries; a ``str`` in the journal."""

    STOP = "stop"                # cb.stop / cerebro stop asked it to
    BUDGET = "budget"            # its time_budget passed
    INTERRUPT = "interrupt"      # Ctrl-C, SIGTERM or a cancelled SQL call
