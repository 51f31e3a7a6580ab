"""A run directory's code (build.pkl) is loaded only where a run of this user signed it
(HMAC with the user's key) or the caller says they trust the directory: ``predict``,
``cb.predict``, ``resume``, ``export --torchscript`` refuse a crafted one before running
anything, while the weights (safetensors) need no trust; another user's key is another
signature. The key itself is checked (32 bytes, the user's, mode 0600, no link: invariant
10), and the signature binds build.pkl to its run's id; the tests without a fit attack both on
a run directory written by RunStore alone."""
from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from _models import build, digits

import cerebro as cb
from cerebro.store import RunStore
from cerebro.store._trust import key_path, new_run_id, signature


@pytest.fixture(scope="module", autouse=True)
def own_key(tmp_path_factory):
    """The runs here sign with a key of the test's, never the user's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CEREBRO_TRUST_KEY", str(tmp_path_factory.mktemp("key") / "trust.key"))
        yield


class Payload:
    """Unpickling it runs a shell command (what a crafted build.pkl can do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> cb.Result:
    return cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
        digits(partitions=2), workers=2, store=tmp_path_factory.mktemp("t") / "run", seed=0, verbose=0)


def crafted(run: cb.Result, tmp_path) -> tuple[str, str]:
    copy = str(shutil.copytree(run.run_dir, tmp_path / "crafted"))
    marker = str(tmp_path / "ran")
    with open(os.path.join(copy, "build.pkl"), "wb") as f:
        f.write(pickle.dumps(Payload(marker)))
    journal = os.path.join(copy, "journal.jsonl")
    with open(journal, "rb") as f:
        lines = f.readlines()
    with open(journal, "wb") as f:
        f.writelines(lines[:-1])        # its run_finished line: a run resume would go on with
    return copy, marker


@pytest.mark.slow
def test_a_crafted_build_is_never_run_without_trust(run, tmp_path):
    copy, marker = crafted(run, tmp_path)
    rows = np.zeros((3, 64), np.float32)
    for attempt in (lambda: cb.load(copy).best.predict(rows), lambda: cb.predict(copy, rows, workers=2),
                    lambda: cb.resume(copy, verbose=0),
                    lambda: cb.resume(copy, epochs=2, verbose=0)):
        with pytest.raises(cb.UntrustedCodeError, match=r"crafted/build.pkl holds code"):
            attempt()
    pd.DataFrame(rows).rename(columns=str).to_parquet(tmp_path / "rows.parquet")
    for command in (["export", copy, "--torchscript", "-o", str(tmp_path / "m.pt")],
                    ["predict", copy, str(tmp_path / "rows.parquet"), "-o", str(tmp_path / "p.parquet")]):
        done = subprocess.run([sys.executable, "-m", "cerebro", *command], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "holds code" in done.stderr, done.stderr
    assert not os.path.exists(marker)
    done = subprocess.run([sys.executable, "-m", "cerebro", "export", copy, "-o", str(tmp_path / "w.safetensors")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and os.path.exists(tmp_path / "w.safetensors") and not os.path.exists(marker)


@pytest.mark.slow
def test_a_run_signed_with_another_users_key_is_not_loaded(run, tmp_path):
    """Another key (another user, another machine): the same run directory, refused."""
    check = ("import cerebro as cb, sys\n"
             "try:\n    cb.load(sys.argv[1]).best.model()\nexcept cb.UntrustedCodeError:\n    sys.exit(7)\n")
    other = subprocess.run([sys.executable, "-c", check, run.run_dir], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "CEREBRO_TRUST_KEY": str(tmp_path / "other.key")})
    assert other.returncode == 7, other.stderr
    assert not os.path.exists(tmp_path / "other.key")        # reading makes no key: only a run signs
    assert stat.S_IMODE(os.stat(key_path()).st_mode) == 0o600      # the fixture's run made this one, owner only
    mine = subprocess.run([sys.executable, "-c", check, run.run_dir], capture_output=True, text=True, timeout=300)
    assert mine.returncode == 0, mine.stderr


@pytest.mark.slow
def test_a_build_signed_with_the_empty_key_is_never_run(run, tmp_path, monkeypatch):
    """What a full disk left an older version with: an empty key, under which anyone can sign.
    A build signed with HMAC(b"") (old style, and new style for the run's own id) is refused."""
    copy, marker = crafted(run, tmp_path)
    with open(os.path.join(copy, "build.pkl"), "rb") as f:
        content = f.read()
    run_id = run.store.read_run_info()["run_id"]
    for signed in (content, b"cerebro build.pkl signature v2\0" + run_id.encode() + b"\0" + content):
        with open(os.path.join(copy, "build.pkl.sig"), "wb") as f:
            f.write(hmac.new(b"", signed, hashlib.sha256).hexdigest().encode())
        with pytest.raises(cb.UntrustedCodeError):              # the run's key is a good one
            cb.load(copy).best.model()
        empty = tmp_path / "empty.key"
        empty.touch(mode=0o600)
        with monkeypatch.context() as patch:
            patch.setenv("CEREBRO_TRUST_KEY", str(empty))
            for attempt in (lambda: cb.load(copy).best.model(), lambda: cb.resume(copy, verbose=0)):
                with pytest.raises(cb.TrustKeyError, match=r"empty.key holds 0 bytes, not 32 .* Delete it"):
                    attempt()
    assert not os.path.exists(marker)


@pytest.mark.slow
def test_resume_keeps_the_run_id_its_build_is_signed_for(run, tmp_path):
    """Resume rewrites run.json (here: extended to 2 epochs); the run's code stays its own."""
    copy = str(shutil.copytree(run.run_dir, tmp_path / "extended"))
    before = json.load(open(os.path.join(copy, "run.json")))["run_id"]
    resumed = cb.resume(copy, epochs=2, backend=cb.LocalBackend(2), verbose=0)
    assert json.load(open(os.path.join(copy, "run.json")))["run_id"] == before
    assert resumed.store.read_run_info()["searcher"]["epochs"] == 2
    assert cb.load(copy).best.model() is not None            # no trust needed: still signed for this run


# --- the key and the binding, attacked without a fit ----------------------------------------

@pytest.fixture
def key(tmp_path, monkeypatch) -> str:
    """Where this test's key is (not made yet)."""
    path = str(tmp_path / "keys" / "trust.key")
    monkeypatch.setenv("CEREBRO_TRUST_KEY", path)
    return path


def signed_run(path, code: bytes = b"build", run_id: str | None = None) -> RunStore:
    """A run directory holding ``code`` as its build, signed by this user, and its run.json."""
    store = RunStore.create(path)
    run_id = run_id or new_run_id()
    store.write_code(code, b"searcher", run_id)
    store.write_run_info({"run_id": run_id, "state_format": 1, "seed": 0, "workers": 1, "data": {"partitions": 1},
                          "searcher": {"class": "GridSearch", "metric": "val_loss", "mode": "min"}})
    return RunStore.open(path)


def _empty(path: str) -> str:
    open(path, "wb").close()
    return "holds 0 bytes, not 32"


def _short(path: str) -> str:
    with open(path, "wb") as f:
        f.write(os.urandom(16))
    return "holds 16 bytes, not 32"


def _readable(path: str) -> str:
    os.chmod(path, 0o644)
    return "has mode 0644: others may read or change it"


def _linked(path: str) -> str:
    os.replace(path, path + ".real")                 # a good key, reached through a link
    os.symlink(path + ".real", path)
    return "is a symbolic link"


def _others(path: str) -> str:
    os.chown(path, 65534, 65534)
    return "is owned by user 65534, not by you"


@pytest.mark.parametrize("spoil", [_empty, _short, _readable, _linked,
                                   pytest.param(_others, marks=pytest.mark.skipif(
                                       os.geteuid() != 0, reason="chown to another user needs root"))])
def test_a_bad_key_neither_signs_nor_vouches(key, tmp_path, spoil):
    good = signed_run(tmp_path / "good")
    problem = spoil(key)
    message = rf"trust key {re.escape(key)} {problem}.* nothing was signed or loaded.*(Delete it|rm ).*CEREBRO_TRUST"
    with pytest.raises(cb.TrustKeyError, match=message):
        good.read_build()                            # checked: refused, not "no key"
    with pytest.raises(cb.TrustKeyError, match=message):
        signed_run(tmp_path / "new")                 # signing: refused, not unsigned
    assert not os.path.exists(tmp_path / "new" / "build.pkl")
    assert RunStore.open(tmp_path / "good", trust=True).read_build() == b"build"
    with pytest.raises(cb.TrustKeyError, match=message):      # a fit stops before any work
        cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
            digits(partitions=1, rows=40), workers=1, store=tmp_path / "fit", seed=0, verbose=0)
    assert not os.path.exists(tmp_path / "fit")


@pytest.mark.parametrize("call", ["write", "fsync"])
def test_a_full_disk_leaves_no_key_and_an_unsigned_run(key, tmp_path, monkeypatch, caplog, call):
    """Writing the new key fails (ENOSPC): no key, empty or not, is left, and the run is not
    signed at all (loading its code then needs trust), not signed with an empty key."""
    real = getattr(os, call)

    def full(handle, *rest):
        if os.path.dirname(os.readlink(f"/proc/self/fd/{handle}")) == os.path.dirname(key):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(handle, *rest)
    with monkeypatch.context() as patch:
        patch.setattr(os, call, full)
        store = signed_run(tmp_path / "run")
    assert os.listdir(os.path.dirname(key)) == []                 # nor a temporary file
    assert store.has("build.pkl") and not store.has("build.pkl.sig")
    assert "could not make the trust key" in caplog.text and "not signed" in caplog.text
    with pytest.raises(cb.UntrustedCodeError):
        store.read_build()
    assert RunStore.open(tmp_path / "run", trust=True).read_build() == b"build"


def test_a_signed_build_copied_into_another_run_is_refused(key, tmp_path):
    mine, other = signed_run(tmp_path / "mine", b"my build"), signed_run(tmp_path / "other", b"other build")
    for name in ("build.pkl", "build.pkl.sig"):
        shutil.copy(tmp_path / "mine" / name, tmp_path / "other" / name)
    with pytest.raises(cb.UntrustedCodeError, match=r"other/build.pkl holds code .* for this run directory"):
        other.read_build()
    assert mine.read_build() == b"my build"
    assert RunStore.open(tmp_path / "other", trust=True).read_build() == b"my build"


def test_a_run_of_an_older_version_loads_only_when_trusted(key, tmp_path):
    """No run_id in run.json, a signature over build.pkl alone (what older versions wrote)."""
    store = signed_run(tmp_path / "old")
    info = store.read_run_info()
    del info["run_id"]
    store.write_run_info(info)
    with open(key, "rb") as f:
        legacy = hmac.new(f.read(), open(store.file("build.pkl"), "rb").read(), hashlib.sha256).hexdigest()
    with open(store.file("build.pkl.sig"), "w") as f:
        f.write(legacy)
    with pytest.raises(cb.UntrustedCodeError, match=r"no run_id in run.json\) need trust=True"):
        store.read_build()
    assert RunStore.open(tmp_path / "old", trust=True).read_build() == b"build"


def test_a_key_made_meanwhile_by_another_process_is_the_one_used(key, monkeypatch):
    """The other process links its key in between this one's write and link: theirs wins."""
    theirs, link = os.urandom(32), os.link

    def late(source, target):
        with open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(theirs)
        link(source, target)                      # FileExistsError: never replaced
    monkeypatch.setattr(os, "link", late)
    assert signature(b"code", "0" * 32) == hmac.new(
        theirs, b"cerebro build.pkl signature v2\0" + b"0" * 32 + b"\0code", hashlib.sha256).hexdigest().encode()
    assert os.listdir(os.path.dirname(key)) == ["trust.key"]


def test_processes_making_the_key_at_once_agree_on_one(key):
    """Three processes, released together once all are ready (each then waits for a line on
    its stdin), each make the key."""
    code = ("import sys\nfrom cerebro.store import _trust\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "_trust.check_key()\nprint(_trust._key(create=False).hex())\n")
    children = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE) for _ in range(3)]
    try:
        assert [child.stdout.readline() for child in children] == [b"ready\n"] * 3
        for child in children:
            child.stdin.write(b"go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            child.kill()
    assert all(child.returncode == 0 for child in children), outputs
    with open(key, "rb") as f:
        made = f.read()
    assert len(made) == 32 and {out.decode().strip() for out, _ in outputs} == {made.hex()}
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600 and os.listdir(os.path.dirname(key)) == ["trust.key"]
    assert stat.S_IMODE(os.stat(os.path.dirname(key)).st_mode) == 0o700
