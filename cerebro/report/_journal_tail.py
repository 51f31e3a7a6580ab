"""Following a run's journal as it grows: each call reads only the lines written since the
last, so a reader that looks every second costs O(new lines), not O(journal), however long
the run. The lines are checked as :meth:`RunStore.read_journal` checks them (CRC-32, field
types), and a journal replaced or cut since (a resume trims a torn tail) is read again from
its start, as if new."""
from __future__ import annotations

from typing import Any

from ..store import _files as files
from ..store._journal_lines import malformed, parse_record
from ..store._run_store import MAX_JOURNAL_BYTES


class JournalTail:
    """The good records of the journal at ``path``, a call at a time: :meth:`read` returns
    whether it started over (the records are then the whole journal) and the new records."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0          # bytes read: up to the end of the last whole line
        self._last = b""         # that line: the journal read before is still there if it is

    def read(self) -> tuple[bool, list[dict[str, Any]]]:
        """Raises what opening or reading the file raises (a FIFO, a directory, a link: an
        :class:`files.UnsafeFileError`; too long: the same), reading no further."""
        try:
            f = files.open_regular(self.path)
        except FileNotFoundError:       # none yet (a run about to begin), or gone: nothing to read
            started_over, self.offset, self._last = self.offset > 0, 0, b""
            return started_over, []
        with f:
            started_over = not self._still_there(f)
            if started_over:
                self.offset, self._last = 0, b""
            f.seek(self.offset)
            chunk = f.read(MAX_JOURNAL_BYTES - self.offset + 1)
        if self.offset + len(chunk) > MAX_JOURNAL_BYTES:
            raise files.UnsafeFileError(f"{self.path} holds more than {MAX_JOURNAL_BYTES:,} bytes, more than any "
                                        f"file of its kind Cerebro writes; it is not read")
        whole = chunk[:chunk.rfind(b"\n") + 1]     # a line being written is read once it ends
        lines = whole.splitlines(keepends=True)
        if lines:
            self.offset, self._last = self.offset + len(whole), lines[-1]
        return started_over, [record for record in map(_good, lines) if record is not None]

    def _still_there(self, f: Any) -> bool:
        """Whether the file still holds, where it ended, the last line read from it: else it
        was replaced or cut, and its lines so far are not the ones read."""
        if not self._last:
            return True
        f.seek(self.offset - len(self._last))
        return bool(f.read(len(self._last)) == self._last)


def _good(line: bytes) -> dict[str, Any] | None:
    """The record on ``line``, or None where it is damaged (as ``read_journal`` skips it)."""
    record = parse_record(line)
    return record if record is not None and malformed(record) is None else None
