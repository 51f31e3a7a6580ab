"""``Dataset.from_ray``: partitions written by Ray's workers from a Ray Dataset's blocks,
never through the driver (see :mod:`._blocks`)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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
        return self._data.map_batches(partial_row(fn), batch_format="numpy", batch_size=None).take_all()

    def _write_groups(self, key: Callable[[Columns], dict[str, np.ndarray]],
                      write: Callable[[Columns], dict[str, Any]]) -> list[dict[str, Any]]:
        keyed = self._data.map_batches(key, batch_format="numpy", batch_size=None)
        return keyed.groupby(["split", "partition"]).map_groups(partial_row(write), batch_format="numpy").take_all()

    def _head(self, rows: int) -> Columns:
        return self._data.take_batch(rows, batch_format="numpy")


def partial_row(fn: Callable[[Columns], dict[str, Any]]) -> Callable[[Columns], dict[str, np.ndarray]]:
    """``fn``, whose result is one record, as a Ray batch function: a batch of one row."""
    def batch(columns: Columns) -> dict[str, np.ndarray]:
        return {name: np.array([value]) for name, value in fn(columns).items()}
    return batch
