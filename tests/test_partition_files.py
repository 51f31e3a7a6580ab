"""Partition files are checked (DESIGN invariant 9): meta.json records each file's size and
CRC-32; a flipped byte, a truncation, a symbolic link or a file rewritten mid-run is refused
with an error naming the file, in memory and streamed, and stops the run."""
from __future__ import annotations

import os
import re
import shutil
import zlib

import numpy as np
import pytest
import torch

import cerebro as cb
from cerebro.data import (
    ArrayDataset,
    PartitionFileError,
    open_partition,
    read_layout,
    write_partitions,
)
from cerebro.worker import in_preflight


@pytest.fixture
def data_dir(tmp_path) -> str:
    rng = np.random.default_rng(0)
    dataset = ArrayDataset(rng.random((400, 8), dtype=np.float32), rng.integers(0, 3, 400), validation=0.25, seed=0)
    directory = str(tmp_path / "data")
    write_partitions(dataset, directory, 2)
    return directory


def part(directory: str, split: str = "train", partition: int = 1) -> str:
    return os.path.join(directory, split, f"part-{partition:05d}.parquet")


def flip_a_byte(path: str, offset: int = 200) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_meta_json_records_each_files_size_and_crc(data_dir):
    layout = read_layout(data_dir)
    for split in ("train", "val"):
        for partition in range(2):
            with open(part(data_dir, split, partition), "rb") as f:
                content = f.read()
            assert layout.file_check(split, partition) == (len(content), zlib.crc32(content))


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_flipped_byte_is_refused_naming_the_file(data_dir, in_memory):
    flip_a_byte(part(data_dir))
    with pytest.raises(PartitionFileError, match=rf"^partition file {re.escape(part(data_dir))} fails its CRC-32 "
                                                 rf"\(0x[0-9a-f]{{8}}, written 0x[0-9a-f]{{8}}\): it was damaged or "
                                                 rf"changed since the run wrote it$"):
        open_partition(read_layout(data_dir), data_dir, "train", 1, in_memory)
    open_partition(read_layout(data_dir), data_dir, "train", 0, in_memory)      # the others load


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_truncated_file_is_refused_before_it_is_mapped(data_dir, in_memory):
    path = part(data_dir)
    size = os.path.getsize(path)
    os.truncate(path, size - 100)
    with pytest.raises(PartitionFileError, match=rf"^partition file {re.escape(path)} has {size - 100} bytes; the run "
                                                 rf"wrote {size} \(truncated or replaced\)$"):
        open_partition(read_layout(data_dir), data_dir, "train", 1, in_memory)


def test_a_symbolic_link_is_refused_even_to_the_right_bytes(data_dir, tmp_path):
    path = part(data_dir)
    shutil.copy(path, tmp_path / "elsewhere.parquet")
    os.remove(path)
    os.symlink(tmp_path / "elsewhere.parquet", path)
    with pytest.raises(PartitionFileError, match=rf"^partition file {re.escape(path)} is a symbolic link \(to "
                                                 rf"'{re.escape(str(tmp_path / 'elsewhere.parquet'))}'\); a run reads "
                                                 rf"only the files it wrote$"):
        open_partition(read_layout(data_dir), data_dir, "train", 1, True)


def test_a_streamed_file_rewritten_after_its_check_stops_the_next_sub_epoch(data_dir):
    source = open_partition(read_layout(data_dir), data_dir, "train", 1, in_memory=False)
    first = list(source.train_batches(seed=1, batch_size=32))
    assert sum(len(label) for _, label in first) == source.rows
    stat = os.stat(part(data_dir))
    os.utime(part(data_dir), ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(PartitionFileError, match=rf"^partition file {re.escape(part(data_dir))} changed during the "
                                                 rf"run \(now \d+ bytes, modified at \d+ ns; checked: \d+ bytes, \d+ "
                                                 rf"ns\); the run stops rather than train on other data$"):
        list(source.train_batches(seed=2, batch_size=32))


def test_partitions_written_before_files_were_checked_still_load(data_dir):
    import json
    meta_path = os.path.join(data_dir, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    del meta["files"]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    source = open_partition(read_layout(data_dir), data_dir, "train", 1, in_memory=True)
    assert source.rows == read_layout(data_dir).rows["train"][1]


def build(config: dict) -> cb.TorchTrainable:
    """A linear model whose loss, once, on the worker holding partition 1, bumps that
    partition file's modification time: a file rewritten under a running run."""
    model = torch.nn.Linear(8, 3)

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        marker = config["path"] + ".touched"
        try:
            if in_preflight():      # on a worker, under the running run
                raise FileExistsError
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))      # once, atomically
            stat = os.stat(config["path"])
            os.utime(config["path"], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        except FileExistsError:
            pass
        return torch.nn.functional.cross_entropy(outputs, targets)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=32)


@pytest.mark.slow
def test_a_partition_file_changed_during_a_streamed_run_stops_it_naming_the_file(tmp_path):
    rng = np.random.default_rng(0)
    data = cb.Dataset.from_numpy(rng.random((400, 8), dtype=np.float32), rng.integers(0, 3, 400), partitions=2,
                                 seed=0, in_memory=False)
    path = str(tmp_path / "run" / "data" / "train" / "part-00001.parquet")
    search = cb.GridSearch(build, {"path": path}, epochs=3)
    with pytest.raises(PartitionFileError, match=rf"partition file {re.escape(path)} changed during the run"):
        search.fit(data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert cb.load(tmp_path / "run").trials[0].status == "parked"      # stopped, not failed: resumable
