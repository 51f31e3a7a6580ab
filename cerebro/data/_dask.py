"""``Dataset.from_dask``: partitions written by Dask's workers from a Dask DataFrame's
partitions, never through the driver (see :mod:`._blocks`)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._blocks import BlockDataset, Columns

if TYPE_CHECKING:
    import pandas as pd

_RECORD = {"split": object, "partition": "int64", "rows": "int64", "digest": object, "size": "int64", "crc": "int64"}


class DaskDataset(BlockDataset, constructors=("from_dask",)):
    """Training data that stays in a Dask DataFrame until ``fit`` has Dask's workers write
    its partitions; made by :meth:`cerebro.Dataset.from_dask`. It runs on the Dask client
    that is current (``distributed.Client``'s default), as the DataFrame's own computations do."""

    engine = "Dask"

    @classmethod
    def from_dask(cls, df: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                  partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                  cache_dir: str | os.PathLike | None = None) -> DaskDataset:
        """See :meth:`cerebro.Dataset.from_dask`."""
        return cls(df, features=features, label=label, validation=validation, partitions=partitions, seed=seed,
                   in_memory=in_memory, cache_dir=cache_dir)

    def _column_names(self, data: Any) -> list[str]:
        import dask.dataframe as dd

        if not isinstance(data, dd.DataFrame):
            raise TypeError(f"from_dask needs a dask.dataframe.DataFrame; got {type(data).__name__}")
        return [str(c) for c in data.columns]

    def _map_blocks(self, fn: Callable[[Columns], dict[str, Any]]) -> list[dict[str, Any]]:
        import dask

        return list(dask.compute(*(dask.delayed(_of_frame(fn))(part) for part in self._data.to_delayed())))

    def _write_groups(self, key: Callable[[Columns], dict[str, np.ndarray]],
                      write: Callable[[Columns], dict[str, Any]], groups: int) -> list[dict[str, Any]]:
        import dask

        # Bytes must stay bytes: Dask would make object columns pyarrow strings.
        with dask.config.set({"dataframe.convert-string": False}):
            keyed = self._data.map_partitions(_keyed_frame(key), meta=_frame(
                features=object, label=self._form.label_dtype, split=object, partition="int64", order="int64",
                tie="int64"))
            grouped = keyed.shuffle(on=["split", "partition"], npartitions=groups)
            written = grouped.map_partitions(_written_groups(write), meta=_frame(**_RECORD)).compute()
        return written.to_dict("records")

    def _head(self, rows: int) -> Columns:
        import pandas as pd

        parts = []       # partition after partition, only as many as the rows take
        for index in range(self._data.npartitions):
            parts.append(self._data.get_partition(index).compute())
            if sum(map(len, parts)) >= rows:
                break
        head = pd.concat(parts).iloc[:rows]
        return {str(c): head[c].to_numpy() for c in head.columns}


def _frame(**dtypes: Any) -> pd.DataFrame:
    """An empty DataFrame of these columns: what Dask is told a function returns."""
    import pandas as pd

    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})


def _of_frame(fn: Callable[[Columns], dict[str, Any]]) -> Callable[[pd.DataFrame], dict[str, Any]]:
    def on_frame(frame: pd.DataFrame) -> dict[str, Any]:
        return fn({str(c): frame[c].to_numpy() for c in frame.columns})
    return on_frame


def _keyed_frame(key: Callable[[Columns], dict[str, np.ndarray]]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def on_frame(frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(key({str(c): frame[c].to_numpy() for c in frame.columns}))
    return on_frame


def _written_groups(write: Callable[[Columns], dict[str, Any]]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def on_frame(frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        records = [write({str(c): group[c].to_numpy() for c in group.columns})
                   for _, group in frame.groupby(["split", "partition"], sort=True)]
        return pd.DataFrame(records, columns=list(_RECORD))
    return on_frame
