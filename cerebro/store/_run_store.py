"""The run directory: everything a run writes, and everything ``cb.load`` reads back.

::

    run.json                 settings, seed, versions, data fingerprint
    journal.jsonl            append-only events (trials, sub-epochs, epoch ends, ends), each
                             line with the CRC-32 of its JSON
    build.pkl                the user's code: build(config) and the searcher as fit got them,
                             cloudpickled; the one file that runs code when read (by resume
                             and TrialResult.model only)
    data/                    the partitions (see cerebro.data)
    trials/t0000/config.json     the trial's config, while its weights are kept
    trials/t0000/checkpoint.state  the latest epoch's model and optimizer state, data only
                             (see _state_codec), after a header line with its epoch, size and
                             CRC-32
    trials/t0000/checkpoint.prev.state  the one before it
    trials/t0000/checkpoint.best.state  the epoch with the best metric so far (a hard link
                             of its checkpoint on a local disk)
    trials/t0000/error.txt       the traceback of a failed trial
    frozen/<digest>.safetensors  frozen layers' weights (TorchTrainable(frozen=...)), once per run
    staged/t0000.17.state    a state a worker wrote at an epoch's end (task 17), until the
                             driver takes it as the checkpoint; removed when the run ends
    history.csv, schedule.csv    written when the run finishes
    stop                     cb.stop's request to a live run (its driver deletes it as it stops)

Runs written before states were data only hold pickles (checkpoints, searcher.pkl); they are
read only when the store is opened with ``trust=True`` (see :mod:`._legacy_pickle`).
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

from .._checks import quoted
from . import _files as files
from . import _unstarted as unstarted
from ._bulk import collector_paused
from ._events import Event
from ._journal_lines import SEEMS, DamagedLine, malformed, parse_record, record
from ._legacy_pickle import UntrustedStateError, read_pickled_state
from ._lock import Lease, lock_local
from ._run_info import checked_run_info
from ._state_codec import read_message
from ._state_files import STATE_FORMAT, check_state_header, read_state_content, split_state_file, write_state_file
from ._trust import UntrustedCodeError, signature, signed_by_me

if TYPE_CHECKING:
    import pandas as pd

_CODE_MAGIC = b"CEREBRO-CODE 1\n"
STAGED = "staged"           # epoch-end states written by workers, taken as checkpoints
BEST = "checkpoint.best.state"
STOP_FILE = "stop"
MAX_RUN_INFO_BYTES = 64 << 20   # run.json holds settings: ~10 kB, a big space's a few MB
MAX_JOURNAL_BYTES = 2 << 30     # ~300 bytes an event: millions of sub-epochs
MAX_CODE_BYTES = 1 << 30        # build.pkl: the build and the searcher, with what their closures hold


class RunStore:
    """Reads and writes one run directory: a local path, a ``file://`` URL, or any URL that
    fsspec reaches (see :mod:`cerebro.store._files`)."""

    def __init__(self, path: str | os.PathLike, trust: bool = False) -> None:
        self.path = files.normalize(os.fspath(path))
        self.trust = trust    # load its code unsigned and the pickled states of older versions
        self._made = False    # create() made the directory

    @classmethod
    def create(cls, path: str | os.PathLike) -> RunStore:
        """A new, empty run directory; an existing run is never overwritten."""
        store = cls(path)
        try:
            holds_run, empty = files.exists(store.file("run.json")), files.is_empty_dir(store.path)
            store._made = empty is None
            if empty is None and files.exists(store.path):
                raise FileExistsError(f"store {store.path!r} is a file, not a directory; choose a new or "
                                      f"empty directory")
            if not holds_run and empty is not False:
                files.makedirs(store.path)
        except FileExistsError:
            raise
        except Exception as error:
            raise OSError(f"store {store.path!r} cannot be reached: {type(error).__name__}: "
                          f"{str(error).splitlines()[0]}") from error
        if holds_run:
            raise FileExistsError(f"store {store.path!r} already holds a run{store._described()}; to finish or "
                                  f"extend it: cb.resume({store.path!r}) or `cerebro resume {store.path}`; to read "
                                  f"it: cb.load({store.path!r}); for a new run, choose another store or delete "
                                  f"this one")
        if empty is False and not unstarted.clear(store.path):
            raise FileExistsError(f"store {store.path!r} is a directory that is not empty; "
                                  f"choose a new or empty directory")
        return store

    def _described(self) -> str:
        """`` (ASHA, created ...)`` from run.json, or nothing where it cannot be read."""
        try:
            info = self.read_run_info()
            return f" ({info['searcher']['class']}, created {info['created']})"
        except Exception:
            return ""

    def undo_create(self) -> None:
        """Remove what a fit that stopped before its run began wrote (see :mod:`._unstarted`)."""
        unstarted.undo(self.path, self._made)

    @classmethod
    def open(cls, path: str | os.PathLike, trust: bool = False) -> RunStore:
        store = cls(path, trust)
        if not files.exists(store.file("run.json")):
            left = unstarted.half_made(store.path)
            if left is not None and unstarted.writing_now(store.path):
                raise FileNotFoundError(f"{store.path!r} holds no run.json yet: a fit is writing its partitions "
                                        f"there; its run begins when they are written")
            if left is not None:
                raise FileNotFoundError(f"{store.path!r} holds no run.json, only {', '.join(left)}: a fit stopped "
                                        f"there before its run began, so there is nothing to resume; delete the "
                                        f"directory, or give the next fit this store (it clears them)")
            raise FileNotFoundError(f"{quoted(store.path)} is not a Cerebro run directory (no run.json)")
        return store

    def file(self, *parts: str) -> str:
        return files.join(self.path, *parts)

    @property
    def data_dir(self) -> str:
        return self.file("data")

    # --- settings -----------------------------------------------------------------------
    def write_run_info(self, info: dict[str, Any]) -> None:
        files.write_atomic(self.file("run.json"), json.dumps(info, indent=1, default=str).encode())

    def read_run_info(self) -> dict[str, Any]:
        """run.json, checked for the entries every reader needs (anyone may have edited it)."""
        content = files.read_regular(self.file("run.json"), MAX_RUN_INFO_BYTES)
        return checked_run_info(io.BytesIO(content), self.file("run.json"))

    @functools.cached_property
    def pickled_states(self) -> bool:
        """Whether an older version wrote this run, with its states pickled (run.json unchecked)."""
        return "state_format" not in json.loads(files.read_regular(self.file("run.json"), MAX_RUN_INFO_BYTES))

    def write_code(self, build: bytes, searcher: bytes, run_id: str) -> None:
        """The cloudpickled ``build`` and searcher, in build.pkl: a JSON line with their sizes,
        then the two blobs, so reading one never unpickles the other; signed for ``run_id`` alone."""
        header = json.dumps({"build": len(build), "searcher": len(searcher)}).encode() + b"\n"
        content = _CODE_MAGIC + header + build + searcher
        signed = signature(content, run_id)
        if signed is not None:          # first: build.pkl is never there unsigned by its writer
            files.write_atomic(self.file("build.pkl.sig"), signed)
        files.write_atomic(self.file("build.pkl"), content)

    def read_build(self) -> bytes:
        return self._read_code()[0]

    def read_searcher(self) -> bytes:
        _, searcher = self._read_code()
        if searcher is None:                         # written before build.pkl held both
            return files.read_regular(self.file("searcher.pkl"), MAX_CODE_BYTES)
        return searcher

    def _read_code(self) -> tuple[bytes, bytes | None]:
        """build.pkl's build and searcher; an older version's holds the build alone (None).
        Refused unless this user's run signed it or the store was opened with ``trust``."""
        content = files.read_regular(self.file("build.pkl"), MAX_CODE_BYTES)
        if not self.trust:
            signed = None
            if self.has("build.pkl.sig"):
                signed = files.read_regular(self.file("build.pkl.sig"), 1024)
            if not signed_by_me(content, signed, self.read_run_info().get("run_id")):
                raise UntrustedCodeError(self.file("build.pkl"))
        if not content.startswith(_CODE_MAGIC):
            return content, None
        head, _, blobs = content[len(_CODE_MAGIC):].partition(b"\n")
        sizes = json.loads(head)
        return blobs[:sizes["build"]], blobs[sizes["build"]:sizes["build"] + sizes["searcher"]]

    def remove(self, *parts: str) -> None:
        files.remove(self.file(*parts))

    def has(self, *parts: str) -> bool:
        return files.exists(self.file(*parts))

    def lock(self) -> IO | Lease:
        """Hold the run for this driver until the returned handle is closed: the operating
        system's lock on a local store (dropped however the process ends), a renewed lease
        file on other file systems (see :mod:`._lock`)."""
        if "://" in self.path:
            return Lease(self.path, self.file(".lock"))
        return lock_local(self.path, self.file(".lock"))

    # --- the journal --------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> None:
        """Add one event to the journal, flushed at once so a crash of the driver loses at most
        this line; events that resume relies on are also synced to the disk."""
        body = json.dumps({"event": event, **fields}, default=float).encode()
        with files.open_append(self.file("journal.jsonl")) as f:
            f.write(record(body))
            if event in _DURABLE:
                files.sync(f)

    def emit(self, event: Event) -> None:
        """Add one typed event to the journal (see :mod:`cerebro.store._events`)."""
        self.append(event.name, **event.record())

    def emit_many(self, events: list[Event]) -> None:
        """Add typed events to the journal in one write, synced once: a simulated run's
        (:mod:`cerebro.engine._simulate`), whose thousands of epochs a second a file opened
        and synced per line would slow a hundredfold."""
        lines = [record(json.dumps({"event": e.name, **e.record()}, default=float).encode()) for e in events]
        with files.open_append(self.file("journal.jsonl")) as f:
            f.write(b"".join(lines))
            files.sync(f)

    def events(self) -> Iterator[dict[str, Any]]:
        """The journal's events whose lines pass their check (see :meth:`read_journal`)."""
        yield from self.read_journal()[0]

    def readable_events(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The journal's good events, and a message (file and line) for each damaged line
        but a torn last one, which a live run is writing or a crash cut (resume drops it)."""
        events, damaged = self.read_journal()
        return events, [str(line) for line in damaged if not line.torn]

    def read_journal(self) -> tuple[list[dict[str, Any]], list[DamagedLine]]:
        """Every event whose line passes its CRC-32 check, and the lines that do not: a
        damaged line in the middle is skipped, not taken for the journal's end."""
        path = self.file("journal.jsonl")
        if not files.exists(path):
            return [], []
        lines = files.read_regular(path, MAX_JOURNAL_BYTES).splitlines(keepends=True)
        events: list[dict[str, Any]] = []
        damaged: list[DamagedLine] = []
        offset = 0
        with collector_paused():
            for number, line in enumerate(lines, start=1):
                event = parse_record(line)
                why = "it fails its CRC-32" if event is None else malformed(event)
                if why is not None:
                    seems = SEEMS.match(line)
                    damaged.append(DamagedLine(path, number, offset, len(events), seems and seems[1].decode(),
                                               torn=number == len(lines) and not line.endswith(b"\n"), why=why))
                elif event is not None:     # always, where nothing is wrong with the line
                    events.append(event)
                offset += len(line)
        return events, damaged

    def truncate_journal(self, size: int) -> int:
        """Drop the journal from byte ``size`` on (a torn or damaged tail); the bytes dropped."""
        content = files.read_regular(self.file("journal.jsonl"), MAX_JOURNAL_BYTES)
        files.write_atomic(self.file("journal.jsonl"), content[:size])
        return len(content) - size

    # --- trials -------------------------------------------------------------------------
    def trial_file(self, trial_id: str, name: str) -> str:
        """Where a trial's file ``name`` is written: ``trials/<id>/`` must be a directory of
        the run's own, not a link to another (:class:`files.UnsafeFileError` names it)."""
        return files.refuse_links(self.path, self.file("trials", trial_id, name))

    def write_config(self, trial_id: str, config: dict[str, Any]) -> None:
        files.write_atomic(self.trial_file(trial_id, "config.json"), json.dumps(config, indent=1).encode())

    def write_checkpoint(self, trial_id: str, state: Any, epoch: int, exploit: bool = False,
                         best: bool = False) -> None:
        """Save a trial's packed state (see :func:`pack_tensors`) after ``epoch`` (``exploit``:
        just copied from another trial by PBT); the previous one is kept as the fallback.
        ``best``: the epoch's metric is the trial's best so far, kept as ``checkpoint.best``
        (written first, so a crash between the two never leaves an older best behind a newer
        checkpoint)."""
        self._put_checkpoint(trial_id, best, lambda target: write_state_file(target, trial_id, epoch, state, exploit))

    def staged_state(self, name: str) -> str:
        """Where a worker writes a state at its epoch's end under ``name``, for
        :meth:`promote_checkpoint` (see :mod:`._state_files`)."""
        return self.file(STAGED, f"{name}.state")

    def promote_checkpoint(self, trial_id: str, staged: str, epoch: int, best: bool = False) -> None:
        """Make the state file a worker wrote at ``staged`` the checkpoint, as
        :meth:`write_checkpoint` would: a second name of the file on a local disk (a copy
        elsewhere), its header and size checked first (a write that did not land stops the
        run naming the file, before the journal says the epoch ended)."""
        check_state_header(staged, trial_id, epoch)
        self._put_checkpoint(trial_id, best, lambda target: files.link_atomic(staged, target))

    def clear_staged(self, recreate: bool = False) -> None:
        """Remove the states workers wrote (at a start, what a crash left, the directory made
        anew: ``recreate``; at the end, names the checkpoints no longer need). Only the state
        files are removed, never what Cerebro did not write there; a ``staged`` that is not a
        directory of the run's own (a link elsewhere) is refused, naming it."""
        staged = self.file(STAGED)
        if "://" in staged:
            files.remove_tree(staged)
            if recreate:      # by the driver: a worker on another host then finds it (NFS caches lookups)
                files.makedirs(staged)
            return
        files.refuse_links(self.path, os.path.join(staged, "-"))
        for name in files.listdir(staged):
            path = os.path.join(staged, name)
            if name.endswith((".state", ".state.tmp")) and stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
        if recreate:
            os.makedirs(staged, exist_ok=True)
        elif os.path.isdir(staged) and not os.listdir(staged):
            os.rmdir(staged)

    def _put_checkpoint(self, trial_id: str, best: bool, put: Callable[[str], None]) -> None:
        current, kept = self.trial_file(trial_id, "checkpoint.state"), self.trial_file(trial_id, BEST)
        if best:
            put(kept)
        if files.exists(current):
            files.move(current, self.trial_file(trial_id, "checkpoint.prev.state"))
        if best:
            files.link_atomic(kept, current)
        else:
            put(current)

    def checkpoints(self, trial_id: str, names: tuple[str, ...] = ("checkpoint.state", "checkpoint.prev.state")
                    ) -> list[dict[str, Any]]:
        """A trial's checkpoints, newest first (``names``: which files; the best epoch's is
        :data:`BEST`): their headers with ``state`` (packed), or ``problem`` where the file is
        torn, corrupted or not data only.

        Raises :class:`UntrustedStateError` for a pickled checkpoint of an older version
        unless the store was opened with ``trust=True``.
        """
        found = []
        for name in names:
            path = self.file("trials", trial_id, name)
            if not files.exists(path):
                continue
            try:
                header, body = split_state_file(read_state_content(path))
                if header.get("format") == STATE_FORMAT:
                    state = read_message(io.BytesIO(body))
                elif self.pickled_states and "format" not in header:
                    if not self.trust:
                        raise UntrustedStateError(path)
                    state = read_pickled_state(body)
                else:
                    raise ValueError(f"its header names the format {quoted(header.get('format'))}; this run's "
                                     f"states are {STATE_FORMAT!r}")
                found.append({**header, "path": path, "state": state})
            except (ValueError, KeyError, TypeError, EOFError) as error:
                found.append({"path": path, "problem": f"{type(error).__name__}: {error}"})
        return found

    def remove_checkpoints(self, trial_id: str, keep: tuple[str, ...] = ()) -> None:
        """Delete a finished trial's checkpoints but those named in ``keep`` (``"last"``, the
        latest epoch's; ``"best"``, :data:`BEST`)."""
        names = {"last": "checkpoint.state", "prev": "checkpoint.prev.state", "best": BEST}
        for which, name in names.items():
            if which not in keep:
                files.remove(self.trial_file(trial_id, name))
        if not keep:     # no weights: the journal has its config, so a run of many trials keeps no file a trial
            files.remove(self.trial_file(trial_id, "config.json"))
            if "://" not in self.path:
                with contextlib.suppress(OSError):     # not empty (its error.txt, a user's file): it stays
                    os.rmdir(self.file("trials", trial_id))

    def read_checkpoint(self, trial_id: str) -> Any:
        """A trial's latest packed state that passes its check; :func:`unpack_tensors` turns
        it into tensors."""
        return self.sound_checkpoint(trial_id)[0]["state"]

    def sound_checkpoint(self, trial_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A trial's newest checkpoint that passes its check (its header with ``state``), and
        every one found (see :meth:`checkpoints`); raises if none does."""
        found = self.checkpoints(trial_id)
        for checkpoint in found:
            if "state" in checkpoint:
                return checkpoint, found
        if not found:
            raise FileNotFoundError(f"trial {trial_id} has no checkpoint in {self.path!r}: "
                                    f"it never finished an epoch")
        raise ValueError(f"every checkpoint of trial {trial_id} in {self.path!r} is damaged: "
                         + "; ".join(f"{c['path']}: {c['problem']}" for c in found))

    def write_error(self, trial_id: str, error: str) -> None:
        files.write_atomic(self.trial_file(trial_id, "error.txt"), error.encode())

    def remove_error(self, trial_id: str) -> None:
        """Remove a failed trial's traceback: it is retried (the journal keeps the reason)."""
        files.remove(self.trial_file(trial_id, "error.txt"))

    def write_table(self, name: str, table: pd.DataFrame) -> None:
        files.write_atomic(self.file(f"{name}.csv"), table.to_csv(index=False).encode())


# Resume rebuilds the run from these; losing one to a crash of the machine would lose work.
_DURABLE = frozenset({"epoch_end", "decision", "decide", "exploit", "trial_ended", "run_finished"})
