"""Set up a run directory and drive a run to its end."""
from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np
import torch

from ..backends import Backend
from ..data import Dataset, write_partitions
from ..report import Progress, Result
from ..store import RunStore
from ._driver import Driver
from ._interface import SearchPolicy


def execute(policy: SearchPolicy, *, build: Any, build_blob: bytes, data: Dataset,
            num_partitions: int, backend: Backend, store: str, seed: int,
            searcher: dict[str, Any], progress: Progress) -> Result:
    """Write the partitions and settings into ``store``, run ``policy`` to the end, return the Result.

    Everything given here has been checked already: this is where work starts.
    """
    run_store = RunStore.create(store)
    layout = write_partitions(data, run_store.data_dir, num_partitions)
    run_store.write_build(build_blob)
    from .. import __version__
    run_store.write_run_info({
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seed": seed,
        "searcher": searcher,
        "backend": repr(backend),
        "workers": backend.workers,
        "threads_per_worker": backend.threads_per_worker,
        "data": {"fingerprint": data.fingerprint(), "partitions": num_partitions,
                 "train_rows": layout.rows["train"], "val_rows": layout.rows["val"],
                 "feature_shape": list(layout.feature_shape), "label_dtype": layout.label_dtype,
                 "split_seed": data.seed},
        "versions": {"cerebro": __version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
    })
    Driver(policy, run_store, backend, seed=seed, num_partitions=num_partitions,
           evaluate=layout.has_validation, build_blob=build_blob, progress=progress).run()
    result = Result(run_store, build)
    run_store.write_table("history", result.history())
    run_store.write_table("schedule", result.schedule())
    return result
