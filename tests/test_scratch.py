"""Scratch directories (the driver's spilled states, a worker's outbox and local partitions)
do not outlive a process killed with SIGKILL for long: the next one of their kind removes
them, and never one whose process is alive, another user's, or anything not made so."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from cerebro.store import _scratch
from cerebro.store._scratch import remove_scratch, scratch_directory, sweep

HOLDER = ("import sys; from cerebro.store._scratch import scratch_directory; "
          "path = scratch_directory('cerebro-t', sys.argv[1]); open(path + '/0.state', 'wb').write(b'x' * 1000); "
          "print(path, flush=True); sys.stdin.read()")     # holds it until its stdin closes


def holder(under: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, under], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def test_a_killed_process_directory_goes_with_the_next_of_its_kind_and_a_live_one_stays(tmp_path):
    under = str(tmp_path)
    killed, killed_dir = holder(under)
    alive, alive_dir = holder(under)
    other_kind = scratch_directory("cerebro-u", under)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert os.path.exists(killed_dir + "/0.state")       # SIGKILL left it behind
    mine = scratch_directory("cerebro-t", under)
    assert not os.path.exists(killed_dir)
    assert os.path.exists(alive_dir + "/0.state") and os.path.isdir(mine) and os.path.isdir(other_kind)
    alive.stdin.close()        # it exits without removing its directory: the next sweep does
    alive.wait()
    assert sweep("cerebro-t-", under) == [alive_dir]
    assert os.path.isdir(mine)           # this process holds it
    remove_scratch(mine)
    remove_scratch(other_kind)
    assert sorted(os.listdir(under)) == []


def test_what_was_not_made_as_a_scratch_directory_is_never_removed(tmp_path):
    under = tmp_path / "tmp"
    under.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "owner").write_text("")               # an unlocked owner file, behind a symlink
    (under / "cerebro-t-link").symlink_to(victim)
    plain = under / "cerebro-t-plain"               # no owner file: someone else's naming
    plain.mkdir()
    linked_owner = under / "cerebro-t-owner-link"   # an owner file that is a symlink
    linked_owner.mkdir()
    (linked_owner / "owner").symlink_to(victim / "owner")
    assert sweep("cerebro-t-", str(under)) == []
    assert victim.is_dir() and plain.is_dir() and linked_owner.is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a directory another user owns")
def test_another_users_abandoned_directory_is_left_alone(tmp_path):
    theirs = scratch_directory("cerebro-t", str(tmp_path))
    os.chown(theirs, 65534, 65534)
    os.close(_scratch._held.pop(theirs))             # its lock let go, as if its process died
    assert sweep("cerebro-t-", str(tmp_path)) == [] and os.path.isdir(theirs)
