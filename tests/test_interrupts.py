"""Ctrl-C and SIGTERM stop a run also when their KeyboardInterrupt lands in a finalizer,
where Python prints "Exception ignored" and goes on (the CI failure of a held run that
never stopped)."""
from __future__ import annotations

import gc
import os
import signal
import sys
import weakref

import pytest

from cerebro.engine._interrupts import interrupts_stop_the_run, raise_if_interrupted


@pytest.fixture
def python_sigint():
    """SIGINT's handler Python's own, as in a user's script (a pytest-xdist worker sets another,
    which a run keeps as a user's own)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class Staged:
    """Stands for the shelf's staged file, removed by a finalizer."""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_swallowed_by_a_finalizer_is_raised_at_the_drivers_next_turn(signum, monkeypatch, python_sigint):
    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_type))
    with interrupts_stop_the_run():
        staged = Staged()
        weakref.finalize(staged, os.kill, os.getpid(), signum)
        del staged                       # the finalizer runs: the signal's raise is swallowed there
        gc.collect()
        assert swallowed == [KeyboardInterrupt]
        with pytest.raises(KeyboardInterrupt, match=f"^signal {int(signum)}$"):
            raise_if_interrupted()
        raise_if_interrupted()           # raised once: the driver's except path goes on undisturbed


def test_the_handlers_are_put_back_and_a_users_own_sigint_handler_is_kept():
    def users(signum, frame):
        raise RuntimeError("the user's")
    before = signal.getsignal(signal.SIGTERM)
    previous = signal.signal(signal.SIGINT, users)
    try:
        with interrupts_stop_the_run():
            assert signal.getsignal(signal.SIGINT) is users
            assert signal.getsignal(signal.SIGTERM) is not before
        assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGINT) is users
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_raised_where_it_lands_is_not_raised_again(python_sigint):
    with interrupts_stop_the_run():
        with pytest.raises(KeyboardInterrupt, match=f"^signal {int(signal.SIGTERM)}$"):
            os.kill(os.getpid(), signal.SIGTERM)       # raised at the next bytecode
        # the driver caught it and stops: the block's end forgets it
    raise_if_interrupted()
