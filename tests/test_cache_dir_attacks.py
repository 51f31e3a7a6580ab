"""A shared cache directory, tried as an attacker (docs/security.md): a worker copies its
partitions only under a directory no other user can swap entries in, and creates each copy
anew without following a link, so another user's files stay untouched."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import cerebro as cb
from cerebro.data._cache import LocalCache, _copy


def _data(tmp_path, cache_dir=None) -> str:
    data_dir = str(tmp_path / "data")
    X = np.random.default_rng(0).random((40, 3), dtype=np.float32)
    cb.Dataset.from_numpy(X, np.arange(40) % 2, partitions=2).write(data_dir, 2)
    return data_dir


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_dir_others_can_write_without_the_sticky_bit_is_refused_naming_it(tmp_path, mode):
    shared = tmp_path / "scratch"
    shared.mkdir()
    os.chmod(shared, mode)
    expected = (f"cache_dir {str(shared)!r} is writable by other users without the sticky bit (mode {mode:o}): they "
                f"could swap what Cerebro writes there; give a directory only you can write, or set its sticky bit "
                f"(chmod +t), as /tmp has")
    with pytest.raises(PermissionError, match=f"^{re.escape(expected)}$"):
        cb.Dataset.from_numpy(np.zeros((8, 2), np.float32), np.zeros(8, int), cache_dir=shared)
    cache = LocalCache(_data(tmp_path), str(shared), worker=0)
    with pytest.raises(PermissionError, match=re.escape(expected)):      # a worker checks it too
        cache.local_dir([0])
    assert os.listdir(shared) == []
    os.chmod(shared, mode | 0o1000)       # sticky, as /tmp: each user's entries are theirs alone
    assert os.path.isdir(cache.local_dir([0]))
    cache.close()


def test_a_cache_dir_under_a_directory_others_can_write_is_refused_naming_that_directory(tmp_path):
    team = tmp_path / "team"              # a team directory without the sticky bit: alice's can be renamed away
    (team / "alice").mkdir(parents=True)
    os.chmod(team, 0o777)
    expected = (f"cache_dir {str(team / 'alice')!r} is under {str(team)!r}, which is writable by other users without "
                f"the sticky bit (mode 777): they could swap what Cerebro writes there")
    with pytest.raises(PermissionError, match=f"^{re.escape(expected)}"):
        LocalCache(_data(tmp_path), str(team / "alice"), worker=0).local_dir([0])
    os.chmod(team, 0o1777)
    cache = LocalCache(_data(tmp_path), str(team / "alice"), worker=0)
    assert os.path.isdir(cache.local_dir([0]))
    cache.close()


def test_a_cache_dir_of_another_user_or_a_link_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a directory another user owns needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PermissionError, match=f"^cache_dir {re.escape(repr(str(theirs)))} is owned by another user "
                                              r"\(uid 65534\)"):
        LocalCache(_data(tmp_path), str(theirs), worker=0).local_dir([0])
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(NotADirectoryError, match=f"^cache_dir {re.escape(repr(str(link)))} is a symbolic link"):
        cb.Dataset.from_numpy(np.zeros((8, 2), np.float32), np.zeros(8, int), cache_dir=link)


def test_a_copy_never_writes_through_a_link_placed_where_it_goes(tmp_path):
    victim = tmp_path / "victims-file"
    victim.write_bytes(b"the victim's own bytes")
    source = tmp_path / "partition"
    source.write_bytes(b"partition bytes")
    target = tmp_path / "cache" / "part-0.parquet"
    target.parent.mkdir()
    os.symlink(victim, str(target) + ".part")     # swapped in before the copy
    with pytest.raises(FileExistsError):
        _copy(str(source), str(target))
    assert victim.read_bytes() == b"the victim's own bytes" and not target.exists()
    os.remove(str(target) + ".part")
    assert _copy(str(source), str(target)) == len(b"partition bytes") and target.read_bytes() == b"partition bytes"


def test_a_link_above_the_cache_dir_swapped_after_the_check_does_not_move_the_copies(tmp_path, monkeypatch):
    # /scratch (sticky) holds another user's link 'a' to a directory of this user's: the check
    # passes, then they point 'a' at their own directory, where they could rename the copies'
    # directory away and put a link to this user's files in its place.
    import cerebro.data._cache as cache_module
    mine, theirs, scratch = tmp_path / "mine" / "b", tmp_path / "theirs" / "b", tmp_path / "scratch"
    for made in (mine, theirs, scratch):
        made.mkdir(parents=True)
    os.chmod(scratch, 0o1777)
    os.chmod(theirs, 0o777)
    link = scratch / "a"
    link.symlink_to(mine.parent)
    checked = cache_module.check_cache_dir

    def check_then_swap(path: str) -> str:
        real = checked(path)
        link.unlink()
        link.symlink_to(theirs.parent)      # the other user wins the race
        return real
    monkeypatch.setattr(cache_module, "check_cache_dir", check_then_swap)
    cache = LocalCache(_data(tmp_path), str(link / "b"), worker=0)
    root = cache.local_dir([0])
    assert os.path.dirname(root) == str(mine) and os.listdir(theirs) == []
    assert sorted(os.listdir(os.path.join(root, "train"))) == ["part-00000.parquet"]
    cache.close()
