"""A run directory's code (build.pkl) is loaded only where a run of this user signed it
(HMAC with the user's key) or the caller says they trust the directory: ``predict``,
``cb.predict``, ``resume``, ``export --torchscript`` refuse a crafted one before running
anything, while the weights (safetensors) need no trust; another user's key is another
signature."""
from __future__ import annotations

import os
import pickle
import shutil
import stat
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from _models import build, digits

import cerebro as cb
from cerebro.store._trust import key_path

pytestmark = pytest.mark.slow


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
