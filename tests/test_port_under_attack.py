"""A real run while its driver's port is flooded from the start: 50 silent connections kept
open (reopened whenever the driver cuts one off) and 50 garbage ones churned. The workers
start, a killed worker is replaced, the run ends bitwise equal to an undisturbed one; the
token never shows in a worker's command line or environment, or in any file of the run directory."""
from __future__ import annotations

import os
import sys

import pytest
from _crash import assert_same_results
from _models import build, digits

import cerebro as cb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from port_flood import Flood, killing_build  # noqa: E402

pytestmark = pytest.mark.slow

SPACE = {"lr": cb.choice([3e-2, 1e-2, 3e-3]), "hidden": cb.choice([16, 32])}


class FloodedBackend(cb.LocalBackend):
    """Local workers, with the flood started before the first of them."""

    flood: Flood | None = None
    authkeys: list[bytes] = []
    cmdlines: list[bytes] = []

    def start(self, address, authkey) -> None:
        if self.flood is None:
            self.flood = Flood(tuple(address))
        self.authkeys = [*self.authkeys, authkey]
        super().start(address, authkey)

    def _spawn(self, worker: int):
        process = super()._spawn(worker)     # Popen returns once the new program runs
        for part in ("cmdline", "environ"):
            with open(f"/proc/{process.pid}/{part}", "rb") as f:
                self.cmdlines = [*self.cmdlines, f.read()]
        return process


def test_a_flooded_port_starts_finishes_and_replaces_a_killed_worker_with_the_same_results(tmp_path):
    store, marker = str(tmp_path / "run"), str(tmp_path / "killed")
    backend = FloodedBackend(2, threads_per_worker=1)
    try:
        result = cb.GridSearch(killing_build(build, store, marker), SPACE, epochs=60).fit(
            digits(partitions=4), backend=backend, store=store, seed=5, verbose=0)
    finally:
        if backend.flood is not None:
            backend.flood.stop()
    assert os.path.exists(marker) and backend.flood.connections > 200
    events = [e["event"] for e in result.store.events()]
    assert events.count("worker_lost") == 1 and events.count("worker_replaced") == 1
    expected = cb.GridSearch(build, SPACE, epochs=60).fit(digits(partitions=4), backend=cb.LocalBackend(
        2, threads_per_worker=1), store=tmp_path / "undisturbed", seed=5, verbose=0)
    assert_same_results(result, expected)
    assert backend.authkeys and len(backend.cmdlines) == 6    # 2 workers, then the replacement
    for key in backend.authkeys:
        assert all(key.hex().encode() not in line and key not in line for line in backend.cmdlines)
        for folder, _, names in os.walk(store):
            for name in names:
                with open(os.path.join(folder, name), "rb") as f:
                    content = f.read()
                assert key not in content and key.hex().encode() not in content, name
