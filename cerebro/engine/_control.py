"""Steering a live run from outside its driver, through its run directory (so it works on
any backend and on a shared store).

:func:`stop` without a trial writes the ``stop`` file: the driver stops at its trials' next
epoch boundaries, resumable. Stopping one trial and adding one are *commands*: the asking
process writes ``commands/<id>.json`` (JSON, never code), the driver takes it at its next
step (:func:`obey`), journals what it did (``trial_stop_asked``, ``trial_added``, so a
resume replays it at the same point) and writes ``commands/<id>.answer.json``, which the
asking process waits for: a refused command raises there, with the driver's reason, and
leaves the run untouched.
"""
from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
import uuid
from collections.abc import Mapping
from typing import Any

from .._checks import quoted
from ..store import STOP_FILE, RunStore, StoreInUseError, TrialAdded, TrialStopAsked
from ..store import _files as files
from ._interface import Decision
from ._trial import Phase
from ._trials import TrialBook

COMMANDS = "commands"
_ANSWER = ".answer.json"
_MAX_COMMAND_BYTES = 1 << 20
_POLL_SECONDS = 0.1


def stop(run_dir: str | os.PathLike, trial: str | None = None, *, timeout: float = 60.0) -> None:
    """Ask the live run in ``run_dir`` to stop: its driver starts no new trial and no new
    epoch, lets the epochs in flight end, and leaves the run resumable (``cb.resume`` goes
    on, to the results the run would have had); this returns at once, and the run's ``fit``
    returns an unfinished :class:`cerebro.Result` when it has stopped. With ``trial``, only
    that trial ends, ``stopped`` with the reason "stopped by the user", where it would next
    go on (its epoch end), while the others go on; this returns once the driver took it
    (within ``timeout`` seconds, else :class:`TimeoutError`).

    Example (a fragment: it needs a live run):
        >>> cb.stop("runs/exp1")                   # or: cerebro stop runs/exp1  # doctest: +SKIP
        >>> cb.stop("runs/exp1", trial="t0003")    # or: cerebro stop runs/exp1 --trial t0003  # doctest: +SKIP
    """
    if trial is not None and not isinstance(trial, str):
        raise TypeError(f"trial={quoted(trial)} must be a trial id such as 't0003'")
    _check_timeout(timeout)
    store = _live(run_dir, "there is nothing to stop")
    if trial is None:
        files.write_atomic(store.file(STOP_FILE), json.dumps({"asked": time.time()}).encode())
        return
    _ask(store, {"kind": "stop_trial", "trial": trial}, timeout)


def add_trial(run_dir: str | os.PathLike, config: Mapping[str, Any], *, timeout: float = 60.0) -> str:
    """Add a trial with ``config`` to the live grid or random search in ``run_dir``; returns
    its id once the driver created it (within ``timeout`` seconds, else
    :class:`TimeoutError`). ``config`` must have the space's keys, each value of its key's
    kind; a config that does not is refused with the reason, the run untouched.

    Example (a fragment: it needs a live run):
        >>> cb.add_trial("runs/exp1", {"lr": 0.005, "hidden": 64})  # doctest: +SKIP
        't0004'

        or, from a shell: ``cerebro add runs/exp1 --config '{"lr": 0.005, "hidden": 64}'``.
    """
    _check_timeout(timeout)
    try:
        text = json.dumps(dict(config), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as error:
        raise TypeError(f"config={quoted(config)} must be a dict of JSON values (numbers, strings, booleans, None, "
                        f"lists): {error}") from None
    store = _live(run_dir, "trials cannot be added to it (cb.resume(run_dir, epochs=N) trains a finished grid, "
                           "random or PBT run longer)")
    return _ask(store, {"kind": "add_trial", "config": json.loads(text)}, timeout)["trial_id"]


def _check_timeout(timeout: Any) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")


def _live(run_dir: str | os.PathLike, finished: str) -> RunStore:
    """The store of a run that a driver runs now; else an error saying what to do (for a
    finished run: ``finished``)."""
    store = RunStore.open(run_dir)
    events = [e["event"] for e in store.events()]
    if events and events[-1] == "run_finished":
        raise ValueError(f"run {store.path!r} has finished; {finished}")
    try:
        store.lock().close()
    except StoreInUseError:
        return store          # its driver holds it: live
    raise ValueError(f"no driver runs {store.path!r} now; `cerebro resume {store.path}` goes on with it")


def _ask(store: RunStore, command: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Write ``command``, wait for the driver's answer; raise the error it answered. However
    this ends (an answer, the timeout, the run ending, Ctrl-C), no command of it is left for
    a later driver: one not taken yet is withdrawn, and one past its expiry is refused."""
    name = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    asked = files.refuse_links(store.path, store.file(COMMANDS, f"{name}.json"))
    answered = store.file(COMMANDS, f"{name}{_ANSWER}")
    files.write_atomic(asked, json.dumps({**command, "expires": time.time() + timeout}).encode())
    deadline, taken = time.monotonic() + timeout, False
    try:
        while not files.exists(answered):
            if time.monotonic() > deadline or _run_ended(store):
                taken = not _withdraw(asked)
                raise TimeoutError(f"the driver of {store.path!r} " + (
                    "took the command but did not answer; its journal says what became of it" if taken else
                    f"did not take the command within {timeout:g} s (or the run ended); nothing was done"))
            time.sleep(_POLL_SECONDS)       # another process answers: a file is all we share
        answer = json.loads(files.read_regular(answered, _MAX_COMMAND_BYTES))
        files.remove(answered)
    finally:
        if not taken:
            _withdraw(asked)
    if "error" in answer:
        raise ValueError(answer["error"])
    return answer


def _withdraw(asked: str) -> bool:
    """Take back a command not taken yet: True where it was still there."""
    try:
        files.remove(asked)
        return True
    except (FileNotFoundError, OSError):
        return False


def _run_ended(store: RunStore) -> bool:
    """Whether the run's last journal line says its driver ended (read from the tail only)."""
    try:
        with files.open_regular(store.file("journal.jsonl")) as f:
            size = getattr(f, "size", None)
            f.seek(max(0, (os.fstat(f.fileno()).st_size if size is None else size) - 4096))
            tail = f.read().strip().rsplit(b"\n", 1)[-1]
    except (OSError, ValueError):
        return False
    return b'"event": "run_finished"' in tail or b'"event": "run_interrupted"' in tail


def take_commands(store: RunStore, refused: set[str]) -> list[tuple[str, Any]]:
    """The driver's side: the commands waiting, oldest first, each removed as it is read,
    whatever it is in it (anything but a small regular file of JSON is answered with an
    error). An entry that is not a regular file (a link, a FIFO, a directory) is answered once
    and left where it is, its name kept in ``refused``: the driver deletes only the files it
    answered. A ``commands`` that is not a directory of the run's own is warned of once and
    not read."""
    try:
        files.refuse_links(store.path, store.file(COMMANDS, "-"))
    except files.UnsafeFileError as error:
        _warn_once(refused, COMMANDS, f"commands are not taken: {error}")
        return []
    taken = []
    for name in files.listdir(store.file(COMMANDS)):
        if not name.endswith(".json") or name.endswith(_ANSWER) or name in refused:
            continue
        path = store.file(COMMANDS, name)
        try:
            if "://" not in path:
                _own_file(path)
            command: Any = json.loads(files.read_regular(path, _MAX_COMMAND_BYTES))
        except Exception as error:      # noqa: BLE001  (a deep nesting's RecursionError too)
            command = ValueError(f"{type(error).__name__}: {error}"[:500])
        if not _discard(path):
            refused.add(name)
        taken.append((name[:-len(".json")], command))
    return taken


def stop_asked(store: RunStore, refused: set[str]) -> bool:
    """Whether ``cb.stop`` asked the run to stop: a regular ``stop`` file, removed as it is
    taken. Anything else of that name (a directory, a link) is warned of once and ignored."""
    path = store.file(STOP_FILE)
    try:
        if "://" in path:
            if not files.exists(path):
                return False
            files.remove(path)
        else:
            _remove_regular(path)
    except FileNotFoundError:
        return False
    except files.UnsafeFileError as error:
        _warn_once(refused, STOP_FILE, f"{error}; it is not a stop request cerebro stop wrote, and is ignored")
        return False
    return True


def _own_file(path: str) -> None:
    """Raise unless ``path`` is a regular file with one name: a link (hard or symbolic) names
    another file, which Cerebro neither acts on nor deletes."""
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode):
        raise files.UnsafeFileError(f"{path} is not a regular file")
    if found.st_nlink != 1:
        raise files.UnsafeFileError(f"{path} has {found.st_nlink} names (a hard link to another file)")


def _remove_regular(path: str) -> None:
    _own_file(path)
    os.unlink(path)


def _warn_once(refused: set[str], key: str, message: str) -> None:
    if key not in refused:
        refused.add(key)
        logging.getLogger("cerebro").warning("%s", message)


def _discard(path: str) -> bool:
    """Remove a command file Cerebro read; False where it is no regular file (left as it is)."""
    try:
        if "://" in path:
            files.remove(path)
        else:
            _remove_regular(path)
    except FileNotFoundError:
        pass
    except files.UnsafeFileError:
        return False
    return True


def answer(store: RunStore, name: str, reply: dict[str, Any]) -> None:
    answered = files.refuse_links(store.path, store.file(COMMANDS, f"{name}{_ANSWER}"))
    files.write_atomic(answered, json.dumps(reply).encode())


def obey(book: TrialBook, command: Any) -> dict[str, Any] | None:
    """Carry out one command on the live trials; the answer for the asking process (None for
    one past its expiry: its asker has given up, and nothing is done)."""
    try:
        if isinstance(command, Exception):
            raise ValueError(f"the command is not readable JSON: {command}")
        if not isinstance(command, dict):
            raise ValueError(f"unknown command {quoted(command)}; expected stop_trial or add_trial")
        if not isinstance(command.get("expires"), (int, float)) or command["expires"] < time.time():
            return None
        if command.get("kind") == "stop_trial":
            return _stop_trial(book, command.get("trial"))
        if command.get("kind") == "add_trial":
            return _add_trial(book, command.get("config"))
        raise ValueError(f"unknown command {quoted(command.get('kind'))}; expected stop_trial or add_trial")
    except Exception as error:      # noqa: BLE001  (no command may stop the run; a deep config's RecursionError)
        return {"error": str(error)[:2000]}


def _stop_trial(book: TrialBook, trial_id: Any) -> dict[str, Any]:
    trial = book.live.get(trial_id) if isinstance(trial_id, str) else None
    if trial is None:
        raise ValueError(f"trial {quoted(trial_id)} is not a live trial of this run; the live ones are "
                         f"{sorted(book.live)}")
    # The next decision about it: the earliest epoch whose evals still run, else the one in flight
    # (or at which it paused, or, the run stopping, at whose end it is parked).
    trial.stop_epoch = min(trial.evaluations, default=trial.epoch)
    book.recorder.emit(TrialStopAsked(trial.trial_id, trial.stop_epoch, book.recorder.now()))
    if trial.phase is Phase.PARKED:        # the run is stopping: it ends now, at its epoch boundary
        book.go_on(trial, Decision.CONTINUE)
    return {"trial_id": trial.trial_id}


def _add_trial(book: TrialBook, config: Any) -> dict[str, Any]:
    added = getattr(book.policy, "added", None)
    if added is None:
        raise ValueError(f"trials cannot be added to a {type(book.policy).__name__} run: it has no added(config)")
    request = added(config)
    book.recorder.emit(TrialAdded(request.config, book.recorder.now()))
    return {"trial_id": book.create(request).trial_id}

