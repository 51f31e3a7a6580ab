"""The CPU time an HTTP server may take from the process it runs in, whatever its clients do.

An answer made cheap is not enough: a client that loops, or floods connections it resets at
once, costs the server a thread and a parse each time, and in the driver that time is taken
under the GIL the run's own scheduling needs. So the server measures the CPU time it spends
(each request's thread, and the accepting thread's share) and, past its budget, accepts no
connection until the budget is back: the connections wait in the kernel's queue, and beyond
it are refused by the kernel, at no cost to the process.
"""
from __future__ import annotations

import threading
import time


class CpuBudget:
    """``share`` of one core on average, at most ``burst`` CPU seconds at once (a token bucket).
    :meth:`charge` what was spent; :meth:`owed` says how long to wait before spending more."""

    def __init__(self, share: float, burst: float) -> None:
        if not 0 < share <= 1 or burst <= 0:
            raise ValueError(f"a CPU budget is a share of a core in (0, 1] (not {share!r}) with a burst > 0 "
                             f"(not {burst!r})")
        self.share, self.burst = share, burst
        self.spent = 0.0             # CPU seconds charged in all
        self._left, self._at = burst, time.monotonic()
        self._lock = threading.Lock()

    def charge(self, seconds: float) -> None:
        with self._lock:
            self._refill()
            self._left -= seconds
            self.spent += seconds

    def owed(self) -> float:
        """Seconds until the budget is not overdrawn (0: spend now)."""
        with self._lock:
            self._refill()
            return max(0.0, -self._left / self.share)

    def _refill(self) -> None:
        now = time.monotonic()
        self._left, self._at = min(self.burst, self._left + (now - self._at) * self.share), now
