"""``Dataset``: the abstract training data of a run, with the constructors users call.

The concrete datasets subclass it: :class:`~cerebro.data.ArrayDataset` (numpy, pandas and
Parquet, held in memory) and :class:`~cerebro.data.SparkDataset` (rows that stay in Spark).
Each names the constructors it builds in its class statement (``constructors=...``) and this
class forwards to it, so this module imports neither of them; :mod:`cerebro.data` imports
both, which registers every constructor before one can be called.
"""
from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Union

from .._checks import Integer, Optional
from ._partitions import PartitionLayout
from ._storage import Storage

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

Validation = Union[float, "Dataset", tuple, None]


def check_partition_count(partitions: Any) -> None:
    """Fail unless ``partitions`` is a positive integer or ``None`` (one partition per worker)."""
    Optional(Integer(low=1, description="a positive integer or None (one partition per worker)")).check(
        "partitions", partitions)


class Dataset(abc.ABC):
    """Training data for a run: features, a label and a validation split.

    Build one with :meth:`from_numpy`, :meth:`from_pandas`, :meth:`from_parquet`,
    :meth:`from_sql`, :meth:`from_spark`, :meth:`from_ray` or
    :meth:`from_dask`. At ``fit`` its rows are shuffled by ``seed`` into
    ``partitions`` slices and written once as Parquet into the run's store; each worker then
    loads only its own partitions.

    Args (of every constructor):
        validation: a fraction of the rows held out (seeded), a separate ``Dataset`` or
            ``(features, label)`` pair, or ``None`` / ``0`` for no validation.
        partitions: number of partitions, fixed for the run; ``None`` means one per worker.
        seed: seeds the validation split and the shuffle into partitions.
        in_memory: ``True``: each worker holds its partitions in memory; ``False``: it streams
            them from disk, row group by row group, holding one shuffle window (about 16 MiB)
            and the next; ``"auto"``: in memory when they take less than half the memory
            the worker's machine has free, said in the run's journal. Results are the same
            bits either way (one sample order: see :mod:`cerebro.data._sample_order`).
        cache_dir: where a worker copies its partitions when the store is not a local path
            (``hdfs://``, ``s3://``, ``file://``, any fsspec URL), once per run, to read them
            from there; default a temporary directory, removed when the worker ends.

    Example:
        >>> import numpy as np
        >>> import cerebro as cb
        >>> X = np.random.default_rng(0).random((100, 8))
        >>> y = np.arange(100) % 2
        >>> data = cb.Dataset.from_numpy(X, y, validation=0.2, partitions=4, seed=0)
        >>> isinstance(data, cb.Dataset), data.num_train_rows, data.has_validation
        (True, 80, True)
    """

    _builders: ClassVar[dict[str, type[Dataset]]] = {}
    # The columns the features came from, in order (from_pandas, from_parquet), so predict can
    # take a DataFrame with them; None where the features came without names.
    feature_columns: list[str] | None = None

    def __init_subclass__(cls, *, constructors: Sequence[str] = (), **kwargs: Any) -> None:
        """Make ``cls`` what the named constructors (classmethods it overrides) build."""
        super().__init_subclass__(**kwargs)
        Dataset._builders.update(dict.fromkeys(constructors, cls))

    def _repr(self, validation_rows: int, features: str, label_dtype: str) -> str:
        """What a user checks before a run: rows, partitions, features, label, storage."""
        columns = f" from {self.feature_columns}" if self.feature_columns else ""
        kind = "class indices" if label_dtype == "int64" else "targets"
        cache = f", cache_dir={self.storage.cache_dir!r}" if self.storage.cache_dir else ""
        return (f"{type(self).__name__}({self.num_train_rows} training rows, {validation_rows} validation rows, "
                f"partitions={'one per worker' if self.partitions is None else self.partitions}, "
                f"features: {features}{columns}, label: {label_dtype} {kind}, "
                f"in_memory={self.storage.in_memory!r}{cache}, seed={self.seed})")

    def __init__(self, *, validation: Any, partitions: int | None, seed: int, in_memory: bool | str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> None:
        check_partition_count(partitions)
        Integer(low=0, description="a non-negative integer").check("seed", seed)
        self.partitions = None if partitions is None else int(partitions)
        self.seed = int(seed)
        self.validation = validation
        self.storage = Storage.checked(in_memory, cache_dir)

    # --- constructors -------------------------------------------------------------------
    @classmethod
    def from_numpy(cls, features: Any, label: Any, *, validation: Validation = 0.2, partitions: int | None = None,
                   seed: int = 0, in_memory: bool | str = "auto",
                   cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a feature array of shape (rows, ...) (any numeric dtype, kept as it is: uint8
        images stay uint8; float64 is stored as float32, what the model gets) or a sequence
        of ``bytes`` (encoded images, which the trainer's ``transform`` decodes), and a label
        array of shape (rows, ...)."""
        return Dataset._builders["from_numpy"].from_numpy(features, label, validation=validation,
                                                          partitions=partitions, seed=seed, in_memory=in_memory,
                                                          cache_dir=cache_dir)

    @classmethod
    def from_pandas(cls, df: pd.DataFrame, *, features: Sequence[str] | None = None, label: str,
                    validation: Validation = 0.2, partitions: int | None = None, seed: int = 0,
                    in_memory: bool | str = "auto", cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a DataFrame: ``features`` names numeric columns or array/list columns
        (concatenated in order; default: every column but the label), or one column of N-D
        arrays (kept in their shape) or of ``bytes``; ``label`` one column."""
        return Dataset._builders["from_pandas"].from_pandas(df, features=features, label=label,
                                                            validation=validation, partitions=partitions,
                                                            seed=seed, in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_parquet(cls, path: str | os.PathLike, *, features: Sequence[str] | None = None, label: str,
                     validation: Validation = 0.2, partitions: int | None = None, seed: int = 0,
                     in_memory: bool | str = "auto", cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a Parquet file or directory, with the columns of :meth:`from_pandas`."""
        return Dataset._builders["from_parquet"].from_parquet(path, features=features, label=label,
                                                              validation=validation, partitions=partitions,
                                                              seed=seed, in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_sql(cls, dsn: str, table_or_query: str, *, features: Sequence[str] | None = None, label: str,
                 validation: Validation = 0.2, partitions: int | None = None, seed: int = 0,
                 in_memory: bool | str = "auto", cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a PostgreSQL table (``"table"`` or ``"schema.table"``) or query, at ``dsn`` (a
        ``postgresql://`` URI), with the columns of :meth:`from_pandas`: numeric columns,
        numeric array columns (``real[]``, ``double precision[]``, ...) or one ``bytea``
        column. Rows are read as Arrow through ADBC's driver (binary COPY, no Python object
        per row; ``pip install 'cerebro[sql]'``), then ordered by their content, so the
        split and the run do not depend on the order the table holds them in. A table of
        more than 2,048 pages (16 MB) is read in ranges of pages over up to 4 connections at
        once (fewer where the server refuses more), all in one snapshot. Missing columns,
        NULLs and non-numeric types are refused, naming the column."""
        return Dataset._builders["from_sql"].from_sql(dsn, table_or_query, features=features, label=label,
                                                      validation=validation, partitions=partitions, seed=seed,
                                                      in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_spark(cls, df: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                   partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                   cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a Spark DataFrame, without collecting it: ``features`` names an array column, a
        pyspark.ml Vector column, a binary column (e.g. Spark's ``binaryFile`` source's
        ``content``), or a list of numeric columns; ``label`` a numeric column;
        ``validation`` a seeded fraction (rows chosen by a hash of their content) or the name
        of a boolean/integer column marking validation rows. ``fit`` writes the partitions
        from the executors into the store, which they must be able to reach."""
        return Dataset._builders["from_spark"].from_spark(df, features=features, label=label,
                                                          validation=validation, partitions=partitions,
                                                          seed=seed, in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_ray(cls, dataset: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                 partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a Ray Dataset (``ray.data``), without collecting it: ``features`` names numeric
        columns, a tensor column (kept in its shape), or one column of ``bytes``; ``label`` a
        numeric column; ``validation`` a seeded fraction (rows drawn by a hash of their
        content) or the name of a boolean/integer column marking validation rows. Ray's
        workers check the rows when the dataset is made and write the partitions into the
        store at ``fit``; the store must be one they reach (see docs/ray.md). The partitions
        depend on the rows and ``seed`` only: the same rows from :meth:`from_dask` give the
        same ones."""
        return Dataset._builders["from_ray"].from_ray(dataset, features=features, label=label,
                                                      validation=validation, partitions=partitions, seed=seed,
                                                      in_memory=in_memory, cache_dir=cache_dir)

    @classmethod
    def from_dask(cls, df: Any, *, features: str | Sequence[str], label: str, validation: Any = 0.2,
                  partitions: int | None = None, seed: int = 0, in_memory: bool | str = "auto",
                  cache_dir: str | os.PathLike | None = None) -> Dataset:
        """From a Dask DataFrame, without collecting it, with the columns and split of
        :meth:`from_ray`; Dask's workers (the current client's) check the rows and write
        the partitions (see docs/dask.md)."""
        return Dataset._builders["from_dask"].from_dask(df, features=features, label=label,
                                                        validation=validation, partitions=partitions, seed=seed,
                                                        in_memory=in_memory, cache_dir=cache_dir)

    # --- what a run uses ----------------------------------------------------------------
    @property
    @abc.abstractmethod
    def num_train_rows(self) -> int:
        """The number of training rows."""

    @property
    @abc.abstractmethod
    def has_validation(self) -> bool:
        """Whether any rows are for validation."""

    @property
    @abc.abstractmethod
    def feature_dtype(self) -> str:
        """The features' dtype as stored: a numpy dtype's name, or ``"bytes"`` (encoded data)."""

    def sample(self, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The first ``rows`` training rows as a worker loads them (features, label), for
        checks on the driver; None where a source cannot give them."""
        return None

    def label_range(self) -> tuple[int, int] | None:
        """The smallest and largest class index over every row (training and validation), for
        the driver's check that the model outputs one value per class; None for float targets."""
        return None

    def check_partitions(self, partitions: int) -> None:
        """Fail early when ``partitions`` cannot each get a training row."""
        check_partition_count(partitions)
        if partitions > self.num_train_rows:
            raise ValueError(f"partitions={partitions} is more than the {self.num_train_rows} "
                             f"training rows; every partition needs at least one row")

    @abc.abstractmethod
    def write(self, data_dir: str, num_partitions: int) -> PartitionLayout:
        """Write the partitions into a run's ``data/`` folder (see :mod:`cerebro.data._partitions`)."""

    @abc.abstractmethod
    def fingerprint(self) -> str:
        """A hash of the rows and the split: two runs on equal fingerprints saw equal data."""
