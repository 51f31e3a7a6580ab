"""``Dataset.from_ray``: partitions written by Ray's workers from a Ray Dataset's blocks,
never through the driver (see :mod:`._blocks`).

Ray Data tells every job it runs on the terminal: INFO lines (the execution plan, progress
logged where stderr is no terminal) and progress bars. Those of Cerebro's own jobs (the
checks when the dataset is made, the sample and the writing at ``fit``) are the run's
business, said by its own progress: they stay out of the terminal (Ray Data's log file in
the Ray session's ``logs/ray-data`` keeps them), its warnings and errors show. With the
``cerebro`` logger at DEBUG (``logging.basicConfig(level=logging.DEBUG)``), all of it shows.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ._blocks import BlockDataset, Columns


class RayDataset(BlockDataset, constructors=("from_ray",)):
    """Training data that stays in a Ray Dataset until ``fit`` has Ray's workers write its
    partitions; made by :meth:`cerebro.Dataset.from_ray`."""

    engine = "Ray"

    @classmethod
    def from_ray(cls, dataset: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                 partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> RayDataset:
        """See :meth:`cerebro.Dataset.from_ray`."""
        return cls(dataset, features=features, label=label, validation=validation, partitions=partitions, seed=seed,
                   in_memory=in_memory, cache_dir=cache_dir)

    def _column_names(self, data: Any) -> list[str]:
        import ray.data

        if not isinstance(data, ray.data.Dataset):
            raise TypeError(f"from_ray needs a ray.data.Dataset; got {type(data).__name__}")
        return list(data.columns())

    def _map_blocks(self, fn: Callable[[Columns], dict[str, Any]]) -> list[dict[str, Any]]:
        with quietly(self._data):
            return self._data.map_batches(partial_row(fn), batch_format="numpy", batch_size=None).take_all()

    def _write_groups(self, key: Callable[[Columns], dict[str, np.ndarray]],
                      write: Callable[[Columns], dict[str, Any]], groups: int) -> list[dict[str, Any]]:
        # A map and a reduce of plain tasks: Ray Data's groupby starts shuffle actors, seconds
        # more than the work on data of a few million rows (benchmarks/cluster_data.py).
        import ray

        cut = ray.remote(_cut_block).options(num_returns=groups)
        with quietly(self._data):
            blocks = self._data.to_numpy_refs()
        # num_returns=groups: each call returns a list of refs, one per group (Ray's types say one ref).
        pieces: list[list[Any]] = [cut.remote(block, key, groups) for block in blocks]  # type: ignore[misc]
        written = ray.remote(_write_pieces)
        records = ray.get([written.remote(write, *(piece[group] for piece in pieces)) for group in range(groups)])
        return [record for record in records if record is not None]

    def _head(self, rows: int) -> Columns:
        with quietly(self._data):
            return self._data.take_batch(rows, batch_format="numpy")


@contextlib.contextmanager
def quietly(dataset: Any) -> Iterator[None]:
    """While the block runs Ray Data jobs on ``dataset`` (or on datasets made from it): no
    progress bars, and Ray Data's console says warnings and errors only (see the module's
    docstring); nothing changes where the ``cerebro`` logger is at DEBUG."""
    if logging.getLogger("cerebro").isEnabledFor(logging.DEBUG):
        yield
        return
    import ray.data

    # A dataset runs with the settings it was made with; datasets made from it copy them.
    contexts = [ray.data.DataContext.get_current(), dataset.context]
    bars = [context.enable_progress_bars for context in contexts]
    consoles = [handler for handler in logging.getLogger("ray.data").handlers
                if isinstance(handler, logging.StreamHandler)]
    for context in contexts:
        context.enable_progress_bars = False
    for handler in consoles:
        handler.addFilter(_shown)
    try:
        yield
    finally:
        for handler in consoles:
            handler.removeFilter(_shown)
        for context, shown in zip(contexts, bars):
            context.enable_progress_bars = shown


def _shown(record: logging.LogRecord) -> bool:
    """Warnings and errors, but not the one that says progress bars are off (they are, here)."""
    return record.levelno >= logging.WARNING and not record.name.startswith("ray.data._internal.progress")


def partial_row(fn: Callable[[Columns], dict[str, Any]]) -> Callable[[Columns], dict[str, np.ndarray]]:
    """``fn``, whose result is one record, as a Ray batch function: a batch of one row."""
    def batch(columns: Columns) -> dict[str, np.ndarray]:
        return {name: np.array([value]) for name, value in fn(columns).items()}
    return batch


def _cut_block(columns: Columns, key: Callable[[Columns], dict[str, np.ndarray]],
               groups: int) -> tuple[dict[str, np.ndarray], ...]:
    """Runs on a worker: a block's keyed rows, cut into its (split, partition) groups (the
    validation groups after the training ones)."""
    keyed = key(columns)
    group = keyed["partition"] + (keyed["split"] == "val") * (groups // 2)
    return tuple({name: values[group == index] for name, values in keyed.items()} for index in range(groups))


def _write_pieces(write: Callable[[Columns], dict[str, Any]], *pieces: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """Runs on a worker: one group's pieces from every block, written as one; None where no
    row went to it."""
    pieces = tuple(piece for piece in pieces if len(piece["label"]))
    if not pieces:
        return None
    return write({name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]})
