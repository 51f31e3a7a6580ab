"""A run directory is untrusted ground (DESIGN invariant 10): it may sit on a shared store or
come as a tarball. Each test plants what an attacker who can write the directory would: a
symbolic link (or a hard link) to a canary file or directory that must stay intact, a FIFO
that would hang a reader, a link to /dev/zero that would be read until memory runs out, a
directory where a file belongs. Cerebro refuses each, naming the path, and writes, deletes
and blocks on nothing it should not."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli import cerebro

import cerebro as cb
from cerebro.data import read_layout
from cerebro.engine._control import _ask, answer, stop_asked, take_commands
from cerebro.results._live import read_live
from cerebro.store import STATE_FORMAT, RunStore
from cerebro.store._files import UnsafeFileError, write_atomic
from cerebro.store._lock import held_locally

CANARY = b"the canary: nothing Cerebro does may change this file\n"
COMMAND = {"kind": "add_trial", "config": {"lr": 0.1}, "expires": 4e9}


@pytest.fixture
def canary(tmp_path: Path):
    """A file outside the run directory, checked intact after the test."""
    path = tmp_path / "canary"
    path.write_bytes(CANARY)
    yield path
    assert path.read_bytes() == CANARY and not path.is_symlink()


@pytest.fixture
def elsewhere(tmp_path: Path):
    """A directory outside the run, with a file and a directory named like Cerebro's
    entries, checked intact after the test."""
    path = tmp_path / "elsewhere"
    (path / "sub.json").mkdir(parents=True)
    (path / "sub.json" / "keep").write_bytes(CANARY)
    (path / "x.json").write_text(json.dumps(COMMAND))
    yield path
    assert sorted(os.listdir(path)) == ["sub.json", "x.json"]
    assert (path / "sub.json" / "keep").read_bytes() == CANARY
    assert json.loads((path / "x.json").read_text()) == COMMAND


@pytest.fixture
def run(tmp_path: Path) -> str:
    """A run directory as a driver starts one: run.json and a journal line."""
    path = tmp_path / "run"
    path.mkdir()
    info = {"state_format": STATE_FORMAT, "seed": 0, "workers": 1, "data": {"partitions": 1},
            "searcher": {"class": "GridSearch", "metric": "val_loss", "mode": "min"}}
    (path / "run.json").write_text(json.dumps(info))
    RunStore.open(path).append("run_started", time=0.0)
    return str(path)


def finishes(call: Callable[[], object], seconds: float = 20.0) -> object:
    """What ``call()`` returned or raised, failing the test where it blocks (on a FIFO)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except Exception as error:   # noqa: BLE001  (the test looks at it)
            outcome.append(error)
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} blocked"
    return outcome[0]


# --- writes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("link", [os.symlink, os.link], ids=["symlink", "hard link"])
def test_a_lock_file_linked_to_another_file_is_refused_by_every_writer_and_the_file_is_untouched(run, canary, link,
                                                                                              monkeypatch, capsys):
    link(canary, os.path.join(run, ".lock"))
    with pytest.raises(UnsafeFileError, match=r"\.lock is (a symbolic link|not the lock file Cerebro makes)"):
        RunStore.open(run).lock()
    with pytest.raises(UnsafeFileError):
        cb.stop(run)
    with pytest.raises(UnsafeFileError):
        cb.add_trial(run, {"lr": 0.1})
    done = cerebro(monkeypatch, capsys, "stop", run)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and ".lock" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not os.path.exists(os.path.join(run, "stop"))


def test_a_lock_file_that_is_a_fifo_does_not_block_the_check_for_a_live_driver(run):
    os.mkfifo(os.path.join(run, ".lock"))
    assert finishes(lambda: held_locally(os.path.join(run, ".lock"))) is False


@pytest.mark.parametrize("link", [os.symlink, os.link], ids=["symlink", "hard link"])
def test_a_journal_linked_to_another_file_is_not_appended_to(tmp_path, canary, link):
    store = tmp_path / "run"
    store.mkdir()
    link(canary, store / "journal.jsonl")
    with pytest.raises(UnsafeFileError, match=r"journal\.jsonl (is a symbolic link|has 2 names)"):
        RunStore(store).append("run_started", time=0.0)


@pytest.mark.parametrize("linked", ["trials", "trials/t0000"])
def test_a_trial_directory_linked_elsewhere_gets_no_config_checkpoint_or_error(run, elsewhere, linked):
    os.makedirs(os.path.dirname(os.path.join(run, linked)), exist_ok=True)
    os.symlink(elsewhere, os.path.join(run, linked))
    store = RunStore.open(run)
    expected = rf"{os.path.join(run, linked)} is a symbolic link, where Cerebro keeps a directory of its own"
    for write in (lambda: store.write_config("t0000", {"lr": 0.1}),
                  lambda: store.write_checkpoint("t0000", {"weights": []}, epoch=1, best=True),
                  lambda: store.write_error("t0000", "Traceback"), lambda: store.remove_error("t0000"),
                  lambda: store.remove_checkpoints("t0000")):
        with pytest.raises(UnsafeFileError, match=expected):
            write()


def test_a_tensorboard_directory_linked_elsewhere_gets_no_logs_and_the_run_goes_on(run, elsewhere, caplog):
    from cerebro.observe._tensorboard import TensorBoardLog
    os.symlink(elsewhere, os.path.join(run, "tensorboard"))
    log = TensorBoardLog(run)
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        for trial in ("t0000", "t0001"):
            log.epoch_end(trial, 1, {"val_loss": 0.5})
            log.trial_ended(trial, "completed", None)
        log.finish("finished")
    warned = [r.getMessage() for r in caplog.records if "no TensorBoard logs are written" in r.getMessage()]
    assert len(warned) == 1 and f"{run}/tensorboard is a symbolic link" in warned[0]


def test_a_staged_directory_linked_elsewhere_is_refused_and_only_state_files_are_ever_removed(run, elsewhere):
    store = RunStore.open(run)
    os.symlink(elsewhere, os.path.join(run, "staged"))
    for recreate in (True, False):
        with pytest.raises(UnsafeFileError, match=r"staged is a symbolic link"):
            store.clear_staged(recreate=recreate)
    os.unlink(os.path.join(run, "staged"))
    store.clear_staged(recreate=True)
    staged = Path(run, "staged")
    (staged / "t0000.3.0.state").write_bytes(b"a state a worker wrote")
    (staged / "notes.txt").write_bytes(CANARY)
    (staged / "d.state").mkdir()
    store.clear_staged()
    assert sorted(os.listdir(staged)) == ["d.state", "notes.txt"]


def test_a_commands_directory_linked_elsewhere_is_neither_read_nor_written(run, elsewhere, caplog):
    os.symlink(elsewhere, os.path.join(run, "commands"))
    store, refused = RunStore.open(run), set()
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        assert take_commands(store, refused) == [] and take_commands(store, refused) == []
    warned = [r.getMessage() for r in caplog.records if "commands are not taken" in r.getMessage()]
    assert len(warned) == 1 and f"{run}/commands is a symbolic link" in warned[0]
    with pytest.raises(UnsafeFileError, match=r"commands is a symbolic link"):
        answer(store, "x", {"trial_id": "t0001"})
    with pytest.raises(UnsafeFileError, match=r"commands is a symbolic link"):
        _ask(store, {"kind": "stop_trial", "trial": "t0000"}, timeout=1)


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_a_stop_that_is_no_regular_file_is_reported_once_and_left_not_fatal(run, canary, kind, caplog):
    stop = os.path.join(run, "stop")
    {"directory": lambda: os.makedirs(os.path.join(stop, "inside")), "symlink": lambda: os.symlink(canary, stop),
     "fifo": lambda: os.mkfifo(stop)}[kind]()
    store, refused = RunStore.open(run), set()
    with caplog.at_level(logging.WARNING, logger="cerebro"):
        assert finishes(lambda: stop_asked(store, refused)) is False
        assert stop_asked(store, refused) is False
    warned = [r.getMessage() for r in caplog.records if "is not a stop request" in r.getMessage()]
    assert len(warned) == 1 and stop in warned[0]
    assert os.path.lexists(stop)


def test_a_stop_file_cerebro_stop_wrote_is_taken_and_removed(run):
    Path(run, "stop").write_text("{}")
    assert stop_asked(RunStore.open(run), set()) is True
    assert not os.path.lexists(os.path.join(run, "stop"))


# --- reads ----------------------------------------------------------------------------------
def test_a_journal_or_live_file_that_is_a_fifo_is_refused_at_once(run):
    os.unlink(os.path.join(run, "journal.jsonl"))
    os.mkfifo(os.path.join(run, "journal.jsonl"))
    os.mkfifo(os.path.join(run, "live.json"))
    error = finishes(lambda: RunStore.open(run).read_journal())
    assert isinstance(error, UnsafeFileError) and "journal.jsonl is a FIFO, not a regular file" in str(error)
    assert finishes(lambda: read_live(run)) is None
    assert isinstance(finishes(lambda: cb.load(run)), UnsafeFileError)


@pytest.mark.parametrize("name", ["run.json", "live.json", "trials/t0000/checkpoint.state", "commands/c.json"])
def test_a_file_linked_to_dev_zero_is_not_read_under_a_memory_cap(run, name):
    """In a process whose address space allows 512 MB more than it uses: reading /dev/zero
    would end it with a MemoryError, or the kernel's kill."""
    path = os.path.join(run, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    os.symlink("/dev/zero", path)
    script = textwrap.dedent(f"""
        import resource, cerebro
        from cerebro.store import RunStore
        from cerebro.results._live import read_live
        from cerebro.engine._control import take_commands
        size = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
        store = RunStore({run!r})
        try:
            print({{"run.json": store.read_run_info, "live.json": lambda: read_live({run!r}),
                   "trials/t0000/checkpoint.state": lambda: store.checkpoints("t0000"),
                   "commands/c.json": lambda: take_commands(store, set())}}[{name!r}]())
        except ValueError as error:
            print("refused:", error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = {"run.json": f"refused: {path} is a symbolic link, not a regular file Cerebro wrote",
            "live.json": "None",
            "trials/t0000/checkpoint.state": f"'problem': 'UnsafeFileError: {path} is a symbolic link",
            "commands/c.json": "[('c', ValueError('UnsafeFileError: "}[name]
    assert said in done.stdout


def test_a_checkpoint_whose_header_understates_its_size_is_refused_before_its_body_is_read(run):
    path = Path(run, "trials", "t0000", "checkpoint.state")
    path.parent.mkdir(parents=True)
    header = {"trial_id": "t0000", "epoch": 1, "exploit": False, "size": 4, "crc": 0, "format": STATE_FORMAT}
    with open(path, "wb") as f:
        f.write(json.dumps(header).encode() + b"\n")
        f.truncate(f.tell() + (64 << 20))       # sparse: a big file that costs no disk
    [found] = RunStore.open(run).checkpoints("t0000")
    assert found["problem"].startswith("ValueError: it is ") and "its header says" in found["problem"]


def test_a_run_json_bigger_than_any_cerebro_writes_is_refused_unread(run):
    with open(os.path.join(run, "run.json"), "r+b") as f:
        f.truncate(65 << 20)
    with pytest.raises(UnsafeFileError, match=r"run\.json holds more than 67,108,864 bytes"):
        RunStore.open(run).read_run_info()


def test_a_run_directorys_mlflow_store_that_is_not_its_own_is_refused(run, canary, elsewhere):
    """A linked mlflow.db would be written through; a planted one whose experiment keeps its
    artifacts elsewhere would have MLflow write models there."""
    from mlflow.tracking import MlflowClient

    from cerebro.observe._mlflow import EXPERIMENT, MLflowLog, tracking_uri
    uri = tracking_uri(True, run)
    os.symlink(canary, os.path.join(run, "mlflow.db"))
    with pytest.raises(UnsafeFileError, match=r"mlflow\.db is a symbolic link, not the MLflow store Cerebro makes"):
        MLflowLog(uri, run, "val_loss", "min", resumed=True)
    os.unlink(os.path.join(run, "mlflow.db"))
    MlflowClient(uri).create_experiment(EXPERIMENT, artifact_location=f"file://{elsewhere}")
    with pytest.raises(ValueError, match=rf"mlflow\.db keeps its artifacts at 'file://{elsewhere}', not in the run"):
        MLflowLog(uri, run, "val_loss", "min", resumed=True)


# --- crafted content with valid checksums ---------------------------------------------------
def _journal_line(record: dict) -> bytes:
    from cerebro.store._journal_lines import record as line
    return line(json.dumps(record).encode())


@pytest.mark.parametrize("event", [
    {"event": "epoch_end", "trial_id": "t0000", "epoch": 1, "metrics": "x", "time": 1.0},
    {"event": "run_started", "workers": [1], "time": 0.0},
    {"event": "trial_ended", "trial_id": ["t0000"], "status": "weird", "time": 1.0}],
    ids=["metrics a string", "workers a list", "status unknown"])
def test_a_journal_line_with_its_crc_but_fields_of_other_types_is_named_and_skipped(run, event):
    with open(os.path.join(run, "journal.jsonl"), "ab") as f:
        f.write(_journal_line(event))
    events, damaged = RunStore.open(run).read_journal()
    assert [e["event"] for e in events] == ["run_started"]
    assert len(damaged) == 1 and damaged[0].number == 2 and f"its {event['event']} field" in str(damaged[0])


@pytest.mark.parametrize("body, why", [
    (b'{"event": ["epoch_end"], "time": 1.0}', "its event name is ['epoch_end'], not a string"),
    (b'{"event": "run_finished", "time": 1.0} {"event": "run_finished"}', "it fails its CRC-32"),
    (b'{"event": "run_finished", "time": 1.0}, {}', "it fails its CRC-32")],
    ids=["event name a list", "two objects", "an object and more"])
def test_a_line_with_its_crc_that_is_not_one_event_is_named_and_skipped(run, body, why):
    from cerebro.store._journal_lines import record as line
    with open(os.path.join(run, "journal.jsonl"), "ab") as f:
        f.write(line(body))
    events, damaged = RunStore.open(run).read_journal()
    assert [e["event"] for e in events] == ["run_started"]
    assert [str(d).split("(", 1)[1] for d in damaged] == [f"{why}) and was skipped"]


def test_json_nested_past_any_readers_depth_is_damage_never_a_recursion_error(run):
    deep = "[" * 5000 + "]" * 5000
    with open(os.path.join(run, "journal.jsonl"), "ab") as f:
        f.write(_journal_line({"event": "epoch_end", "metrics": "@"}).replace(b'"@"', deep.encode()))
    [damaged] = RunStore.open(run).read_journal()[1]
    assert "fails its CRC-32" in str(damaged)
    Path(run, "trials", "t0000").mkdir(parents=True)
    Path(run, "trials", "t0000", "checkpoint.state").write_text(deep + "\n")
    [found] = RunStore.open(run).checkpoints("t0000")
    assert found["problem"].startswith("ValueError: its first line is not a state file's header")
    Path(run, "data").mkdir()
    Path(run, "data", "meta.json").write_text(deep)
    with pytest.raises(ValueError, match=r"meta\.json is damaged: RecursionError"):
        read_layout(os.path.join(run, "data"))
    Path(run, "run.json").write_text(deep)
    with pytest.raises(ValueError, match=r"run\.json is damaged: it is not JSON"):
        RunStore.open(run).read_run_info()


@pytest.mark.parametrize("plant", ["fifo", "dev zero", "empty object"])
def test_a_partition_layout_that_is_no_file_cerebro_wrote_is_refused_at_once(run, plant):
    meta = Path(run, "data", "meta.json")
    meta.parent.mkdir()
    {"fifo": lambda: os.mkfifo(meta), "dev zero": lambda: os.symlink("/dev/zero", meta),
     "empty object": lambda: meta.write_text("{}")}[plant]()
    error = finishes(lambda: read_layout(os.path.join(run, "data")))
    assert isinstance(error, ValueError) and str(error).startswith(f"{meta} is damaged: ")


@pytest.mark.parametrize("name", ["report.html", "report.html.tmp", "history.csv.tmp"])
def test_a_directory_where_a_file_is_written_is_named_in_one_error(run, name):
    os.makedirs(os.path.join(run, name, "inside"))
    target = os.path.join(run, name.removesuffix(".tmp"))
    with pytest.raises(UnsafeFileError, match=rf"^{os.path.join(run, name)} is a directory, not a regular file"):
        write_atomic(target, b"page")
    assert os.listdir(os.path.join(run, name)) == ["inside"]


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_a_lock_that_is_a_directory_or_a_socket_is_named_not_taken_for_an_unwritable_store(run, kind):
    lock = os.path.join(run, ".lock")
    if kind == "directory":
        os.mkdir(lock)
    else:
        import socket
        server = socket.socket(socket.AF_UNIX)
        server.bind(lock)
        server.close()
    with pytest.raises(UnsafeFileError, match=r"\.lock is not the lock file Cerebro makes"):
        RunStore.open(run).lock()


def test_a_stop_or_a_command_hard_linked_to_another_file_is_neither_obeyed_nor_deleted(run, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(COMMAND))
    os.link(outside, os.path.join(run, "stop"))
    os.makedirs(os.path.join(run, "commands"))
    os.link(outside, os.path.join(run, "commands", "c.json"))
    store, refused = RunStore.open(run), set()
    assert stop_asked(store, refused) is False
    [(name, command)] = take_commands(store, refused)
    assert name == "c" and isinstance(command, ValueError) and "hard link" in str(command)
    assert os.path.exists(os.path.join(run, "stop")) and os.path.exists(os.path.join(run, "commands", "c.json"))
    assert os.stat(outside).st_nlink == 3


def test_a_run_json_does_not_point_a_resume_elsewhere_unless_the_directory_is_trusted(run):
    from cerebro.engine._settings import RunSettings
    info = RunStore.open(run).read_run_info()
    info["data"].update(val_rows=[1], cache_dir="/tmp/elsewhere")
    info["mlflow"] = "http://127.0.0.1:1/"
    with pytest.warns(UserWarning, match=r"run\.json's mlflow is 'http://127\.0\.0\.1:1/'.*trust=True") as said:
        settings = RunSettings.from_run_info(info)
    assert settings.mlflow is False and settings.storage.cache_dir is None
    assert any("data.cache_dir is '/tmp/elsewhere'" in str(w.message) for w in said)
    trusted = RunSettings.from_run_info(info, trusted=True)
    assert trusted.mlflow == "http://127.0.0.1:1/" and trusted.storage.cache_dir == "/tmp/elsewhere"


def test_a_run_json_naming_a_run_to_warm_start_from_or_a_module_to_import_is_refused(run, tmp_path, monkeypatch):
    from cerebro.engine._settings import RunSettings
    from cerebro.store import RunInfoError
    info = RunStore.open(run).read_run_info()
    private = str(tmp_path / "another-users-private-run")
    info["searcher"].update(warm_start=private)
    info["data"].update(val_rows=[1])
    expected = (f"run.json's searcher.warm_start is {private!r}: resuming would copy that run's weights into this "
                f"one, and a run directory's settings may have been edited by anyone who can write it; if you made "
                f"this run, resume it with trust=True (--trust)")
    with pytest.raises(RunInfoError, match=f"^{re.escape(expected)}$"):
        RunSettings.from_run_info(info)
    assert RunSettings.from_run_info(info, trusted=True).warm_start.run_dir == private
    # This user's own run: its pointers were signed with their key as it started, and are used as
    # they are; edited after (or signed for another run id), they are not.
    from cerebro.engine._settings import sign_pointers
    signed = sign_pointers({**info, "run_id": "a" * 32})
    assert RunSettings.from_run_info(signed).warm_start.run_dir == private
    for edited in ({**signed, "run_id": "b" * 32}, {**signed, "searcher": {**signed["searcher"], "warm_start": "/x"}},
                   {**signed, "keras_backend": "jax"}):
        with pytest.raises(RunInfoError, match="resume it with trust=True"):
            RunSettings.from_run_info(edited)
    del info["searcher"]["warm_start"]
    for planted in ("os", "x" * 100_000):       # trusted or not, a worker imports nothing but a Keras backend
        info["keras_backend"] = planted
        for trusted in (False, True):
            with pytest.raises(RunInfoError, match=r"^run\.json's keras_backend is ('os'|'x{199}\.\.\. \(100002 "
                                                   r"characters\)); a run's is one of tensorflow, jax, torch or null"):
                RunSettings.from_run_info(info, trusted=trusted)
    # Unsigned (edited), a Keras backend is taken only where the user's KERAS_BACKEND names it:
    # a torch run edited to say 'jax' had its fork server and workers import JAX.
    info["keras_backend"] = "jax"
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    with pytest.raises(RunInfoError, match=r"^run\.json's keras_backend is 'jax': resuming would import Keras on it "
                                           r"in every worker.*; set KERAS_BACKEND=jax to resume on it, or if you made "
                                           r"this run, resume it with trust=True \(--trust\)$"):
        RunSettings.from_run_info(info)
    assert RunSettings.from_run_info(info, trusted=True).keras_backend == "jax"
    assert RunSettings.from_run_info(sign_pointers({**info, "run_id": "a" * 32})).keras_backend == "jax"
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert RunSettings.from_run_info(info).keras_backend == "jax"


def test_a_run_json_that_asks_for_a_million_workers_or_other_partitions_is_refused(run):
    from cerebro.engine._resume import _check_partitions, _recorded_workers
    from cerebro.store import RunInfoError
    meta = {"num_partitions": 2, "feature_shape": [64], "label_shape": [], "label_dtype": "int64",
            "rows": {"train": [5, 5], "val": [1, 1]}}
    Path(run, "data").mkdir()
    store = RunStore.open(run)
    with pytest.raises(RunInfoError, match=r"data/meta\.json is missing: the run's partitions cannot be read"):
        _check_partitions(store, {"data": {"partitions": 5000}})      # deleted so that no count is checked
    Path(run, "data", "meta.json").write_text(json.dumps(meta))
    info = {**store.read_run_info(), "workers": 1_000_000}
    info["data"] = {"partitions": 2}
    with pytest.raises(RunInfoError, match=r"its workers=1000000 must be between 1 and the run's 2 partitions"):
        _recorded_workers(store, info)
    for split in ("train", "val"):
        Path(run, "data", split).mkdir()
        for partition in range(2):
            Path(run, "data", split, f"part-{partition:05d}.parquet").write_bytes(b"")
    info["data"] = {"partitions": 2}
    _check_partitions(store, info)
    info["data"] = {"partitions": 10**12}
    with pytest.raises(RunInfoError, match=r"its data\.partitions is 1000000000000 and data/meta\.json's 2, but the "
                                           r"run wrote 2 training partition files"):
        _check_partitions(store, info)
    # run.json and meta.json edited together (a 2-partition run resumed with 20 workers): the files count
    Path(run, "data", "meta.json").write_text(json.dumps({**meta, "num_partitions": 20,
                                                          "rows": {"train": [5] * 20, "val": [1] * 20}}))
    info["data"] = {"partitions": 20}
    with pytest.raises(RunInfoError, match=r"its data\.partitions is 20 and data/meta\.json's 20, but the run wrote 2 "
                                           r"training partition files"):
        _check_partitions(store, info)


def test_planted_partition_files_do_not_let_an_edited_run_json_start_more_workers_than_cores(run, monkeypatch):
    # run.json, meta.json and as many partition files as the count needs, all edited or planted
    # by whoever can write the run directory: the count checks pass, and resume would start
    # that many processes (30 on a 2-core machine, tried) without the cap.
    from cerebro.engine._resume import _recorded_workers
    from cerebro.store import RunInfoError
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    store, info = RunStore.open(run), {"workers": 30, "data": {"partitions": 30}}
    expected = (f"{store.file('run.json')}'s workers=30 is more than this machine's 2 cores, the most a resume starts "
                f"from what a run directory says (anyone who can write it may have edited it); pass workers= to resume "
                f"(--workers) to choose, or trust=True (--trust) if you made this run")
    with pytest.raises(RunInfoError, match=f"^{re.escape(expected)}$"):
        _recorded_workers(store, info)
    assert _recorded_workers(store, info, trusted=True) == 30
    assert _recorded_workers(store, {**info, "workers": 2}) == 2
    for odd in ("30", 2.0, True, None, "x" * 100_000):
        with pytest.raises(RunInfoError, match=r"is damaged: its workers=('30'|2\.0|True|None|'x{199}\.\.\. "
                                               r"\(100002 characters\)) must be between 1 and the run's 30 partitions"):
            _recorded_workers(store, {**info, "workers": odd})


def test_a_users_own_run_resumes_with_its_workers_and_limits_and_an_edited_one_with_neither(run, monkeypatch):
    # Signed with the user's key as the run starts, run.json's workers and limits are taken as
    # they are (a 4-worker run resumed on a 2-core laptop); edited after, the workers are capped
    # at the cores and the limits are the defaults (an edit could make every sub-epoch a hang,
    # retry a worker-killing trial without end, or drop the checkpoints kept), said once.
    from cerebro.engine._resume import _recorded_workers
    from cerebro.engine._settings import Limits, RunSettings, counts_trusted, sign_pointers
    from cerebro.store import RunInfoError
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    store, info = RunStore.open(run), RunStore.open(run).read_run_info()
    chosen = {"trial_timeout": None, "max_failures": 3, "max_trial_losses": 5, "keep_checkpoints": 2,
              "hang_after": 900.0}
    info.update(workers=4, limits=chosen, data={"partitions": 4, "val_rows": [1]})
    signed = sign_pointers({**info, "run_id": "a" * 32})
    assert counts_trusted(signed) and _recorded_workers(store, signed, counts_trusted(signed)) == 4
    assert RunSettings.from_run_info(signed).limits == Limits(**chosen)
    for edited in ({**signed, "workers": 3}, {**signed, "limits": {**chosen, "hang_after": 1e-9}},
                   {**signed, "run_id": "b" * 32}, info):
        assert not counts_trusted(edited) and counts_trusted(edited, trusted=True)
        if edited["workers"] > 2:
            with pytest.raises(RunInfoError, match="is more than this machine's 2 cores"):
                _recorded_workers(store, edited, counts_trusted(edited))
        with pytest.warns(UserWarning, match=r"^run\.json's limits \{.*\} are not signed by your key for this run "
                                             r"\(it was edited, or made by another user or an older version\), so "
                                             r"this resume keeps the default limits: resume with trust=True "
                                             r"\(--trust\) to use them$"):
            assert RunSettings.from_run_info(edited).limits == Limits()
        assert RunSettings.from_run_info(edited, trusted=True).limits == Limits(**edited["limits"])


def test_messages_about_what_a_run_directory_holds_quote_at_most_a_few_hundred_characters_of_it(run):
    from cerebro.engine._control import obey
    from cerebro.engine._settings import RunSettings
    huge = "x" * 100_000
    answer = obey(None, {"kind": huge, "expires": 2**40})
    assert answer["error"] == f"unknown command '{'x' * 199}... (100002 characters); expected stop_trial or add_trial"
    info = RunStore.open(run).read_run_info()
    info["data"].update(val_rows=[1])
    info["mlflow"] = huge
    with pytest.warns(UserWarning) as said:
        RunSettings.from_run_info(info)
    assert len(str(said[0].message)) < 500 and "(100002 characters)" in str(said[0].message)
    del info["mlflow"]
    from cerebro.store import RunInfoError
    for name, value in (("visit_order", huge), ("data.val_rows", huge), ("data.val_rows", [1, "x"]),
                        ("limits", {huge: 1}), ("limits", huge)):
        edited = json.loads(json.dumps(info))
        *parents, key = name.split(".")
        (edited[parents[0]] if parents else edited)[key] = value
        with pytest.raises(RunInfoError) as refused:        # Python's enum quoted all 100 KB (cerebro resume)
            RunSettings.from_run_info(edited)
        assert str(refused.value).startswith(f"run.json's {name} is {cb._checks.quoted(value)}; a run's is ")
        assert len(str(refused.value)) < 500


@pytest.mark.parametrize("line", [
    {"event": "trial_created", "trial_id": "../../another_users_run/trials/t0000", "config": {"lr": 0.1}},
    {"event": "exploit", "trial_id": "t0001", "source": "/etc/t0000"},
    {"event": "decide", "decisions": {"t0001": "continue", "../t0002": "stop"}, "time": 1.0},
])
def test_a_journal_line_naming_a_trial_by_a_path_is_damage_not_a_file_to_read(line):
    from cerebro.store._journal_lines import malformed
    said = malformed(line)
    assert said is not None and ("not a trial id such as 't0003'" in said or "not only trial ids" in said)
    assert malformed({**line, "trial_id": "t0001", "source": "t0000", "decisions": {"t0001": "stop"}}) is None


@pytest.mark.parametrize("crafted", ["other names", "other shapes", "a 100 KB name"])
def test_a_stored_frozen_file_of_the_right_size_with_other_tensors_is_refused_naming_it_briefly(crafted, tmp_path):
    import torch
    from safetensors.torch import save

    from cerebro.worker._frozen_weights import restore_frozen

    class Store:
        def file(self, *parts: str) -> str:
            return str(tmp_path.joinpath(*parts))
    frozen = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
    weights = {k: v.contiguous() for k, v in frozen.state_dict().items()}
    weights = {"other names": {f"{k}x": v for k, v in weights.items()},
               "other shapes": {k: v.reshape(-1) for k, v in weights.items()},
               "a 100 KB name": {"k" * 100_000: torch.zeros(1)}}[crafted]
    trained_on = "ab" * 32
    path = tmp_path / "frozen" / f"{trained_on}.safetensors"
    path.parent.mkdir()
    path.write_bytes(save(weights))
    head = torch.nn.Linear(16, 2)
    trainable = cb.TorchTrainable(head, torch.optim.SGD(head.parameters(), lr=0.1),
                                  torch.nn.functional.cross_entropy, batch_size=8, frozen=frozen)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} does not hold the frozen layers t0003 trained on: "
                                         r"Error\(s\) in loading state_dict") as refused:
        restore_frozen(trainable, trained_on, Store(), "t0003")      # torch's RuntimeError named neither
    assert len(str(refused.value)) < len(str(path)) + 500


@pytest.mark.parametrize("args", [
    ["status", "{huge}"], ["status", "{run}", "--trial", "{huge}"], ["resume", "{run}", "--epochs", "{huge}"],
    ["demo", "--framework", "{huge}"], ["export", "{run}", "--epoch", "{huge}", "-o", "{run}/m.safetensors"],
    ["predict", "{run}", "/{huge}", "-o", "{run}/p.parquet"], ["report", "{run}", "-o", "{run}/{huge}.html"]])
def test_the_command_line_quotes_at_most_a_few_hundred_characters_of_a_100_kb_argument(run, args, monkeypatch,
                                                                                        capsys):
    # click's own messages (a path that does not exist, a choice, an integer) and Cerebro's
    # ("is not a trial of ...") quoted the whole argument back, 100 KB on the terminal.
    huge = "x" * 100_000
    if "--trial" in args or "--epoch" in args:         # a run with trials to name
        from _search_sim import no_build
        run = cb.simulate(cb.GridSearch(no_build, {"lr": cb.choice([0.1, 0.01])}, epochs=1, metric="loss", mode="min"),
                          lambda config, epoch: {"loss": config["lr"]}, store=Path(run).parent / "simulated").run_dir
    done = cerebro(monkeypatch, capsys, *(a.format(huge=huge, run=run) for a in args))
    assert done.returncode == 2 and "characters)" in done.stderr
    assert len(done.stderr) < 2_000, done.stderr[:300]


def test_a_journal_line_with_its_crc_lacking_a_field_every_reader_needs_is_named_and_skipped(tmp_path):
    # Anyone who can write the run directory can append a line with its CRC: one without the
    # workers of a run_started, the config of a trial_created, the status of a trial_ended...
    # made cb.load (so cerebro status, report and resume) fail with an AttributeError or TypeError.
    from _search_sim import no_build

    from cerebro.store._events import EVENTS
    real = cb.simulate(cb.GridSearch(no_build, {"lr": cb.choice([0.1, 0.01])}, epochs=2, metric="loss", mode="min"),
                       lambda config, epoch: {"loss": config["lr"] / epoch}, store=tmp_path / "real")
    samples: dict[str, dict] = {}
    for line in Path(real.run_dir, "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        samples.setdefault(record.pop("event"), {k: v for k, v in record.items() if k != "crc"})
    crafted = [(name, {}) for name in EVENTS]
    crafted += [(name, {k: v for k, v in fields.items() if k != left}) for name, fields in samples.items()
                for left in fields]
    for name, fields in crafted:
        run = tmp_path / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(real.run_dir, run)
        RunStore.open(run).append(name, **fields)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # a damaged line is said, and skipped
            loaded = cb.load(run)
            loaded.history(), loaded.summary(), loaded.schedule(), loaded.best
        assert sorted(t.trial_id for t in loaded.trials) == ["t0000", "t0001"], (name, sorted(fields))
