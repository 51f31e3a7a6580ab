"""``fit``'s HOW: check the run's settings, set up its run directory, drive it to its end."""
from __future__ import annotations

import logging
import os
import platform
import secrets
import sys
import sysconfig
import time
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np
import torch

from .._objectives import primary
from .._version import __version__
from ..backends import Backend
from ..data import Dataset
from ..observe import ConsoleProgress, Fanout, NoProgress, Progress, TensorBoardLog
from ..observe._live import LiveFile
from ..observe._metrics import MetricsEndpoint
from ..observe._mlflow import MLflowLog, tracking_uri
from ..results import Result
from ..store import STATE_FORMAT, RunStore
from ..store._files import UnsafeFileError
from ..store._trust import check_key, new_run_id
from ..worker import KerasTrainable, driver_keras_backend
from ._driver import Driver
from ._how import How
from ._interface import SearchPolicy
from ._interrupts import interrupts_stop_the_run
from ._preflight import check_build, first_trials
from ._settings import RunSettings, WarmStartFrom, sign_pointers
from ._visit_order import VisitScheme
from ._warm import check_warm_start


def execute(policy: SearchPolicy, how: How, *, build: Callable[[dict], Any],
            example_configs: Sequence[dict[str, Any]], metric: str | Sequence[str], mode: str | Sequence[str],
            settings: dict[str, Any], data: Dataset) -> Result:
    """Run ``policy`` with MOP, as ``how`` (checked: :func:`._how.check_how`) says; every
    argument is checked before any worker starts. ``metric`` and ``mode``: the search's
    objectives (see :mod:`cerebro._objectives`); the first ranks epochs and trials.

    ``build`` is checked on the driver (see :mod:`._preflight`) with the first trials the
    policy starts with, then ``example_configs`` (configurations drawn from the space).
    """
    options = how.options
    seed = secrets.randbelow(2**31) if options.seed is None else options.seed
    build_blob = pickle_build(build)
    trainable = check_build(build, [*first_trials(policy, int(seed)), *example_configs], metric, data)
    keras_backend = driver_keras_backend() if isinstance(trainable, KerasTrainable) else None
    how.backend.expect_keras(keras_backend)
    store = options.store
    if store is None:
        store = os.path.join("cerebro_runs", f"{settings['class'].lower()}-"
                                             f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
    searcher_blob = pickle_build(policy)
    first = primary(metric, mode)       # what makes an epoch a trial's best, what patience watches
    run_settings = RunSettings(int(seed), how.partitions, data.has_validation, options.limits, VisitScheme.LATIN,
                               data.storage, keras_backend=keras_backend, metric=first.metric, mode=first.mode,
                               time_budget=options.time_budget, patience=settings.get("patience"),
                               min_delta=settings.get("min_delta", 0.0), warm_start=WarmStartFrom.of_searcher(settings),
                               tensorboard=options.tensorboard, mlflow=options.mlflow,
                               metrics_port=options.metrics_port, metrics_host=options.metrics_host)
    check_key()             # a bad trust key stops the run here, not once its partitions are written
    run_store = RunStore.create(store)
    lock = run_store.lock()
    try:
        with interrupts_stop_the_run():
            return _run(policy, run_store, (build, build_blob, searcher_blob), settings, data, how.backend,
                        run_settings, options.verbose)
    except BaseException:
        _undo_create(run_store)
        raise
    finally:
        lock.close()


def _undo_create(run_store: RunStore) -> None:
    """A fit that failed before its run began leaves nothing that blocks the corrected one."""
    try:
        run_store.undo_create()
    except OSError as error:      # the fit's own error is the one to show
        logging.getLogger("cerebro").warning("could not remove what the failed fit wrote in %s: %s",
                                             run_store.path, error)


def _run(policy: SearchPolicy, run_store: RunStore, code: tuple[Callable[[dict], Any], bytes, bytes],
         searcher_settings: dict[str, Any], data: Dataset, backend: Backend, settings: RunSettings,
         verbose: int) -> Result:
    """Write the run directory (partitions, build, searcher, run.json), drive the run, and
    return its :class:`Result`; the arguments are ``execute``'s, checked (``code``: the build,
    and the build and the searcher pickled)."""
    build, build_blob, searcher_blob = code
    layout = data.write(run_store.data_dir, settings.num_partitions)
    if settings.warm_start is not None:
        check_warm_start(settings.warm_start, {"feature_shape": list(layout.feature_shape),
                                               "feature_dtype": layout.feature_dtype})
    run_id = new_run_id()               # build.pkl's signature holds beside this run.json alone
    run_store.write_code(build_blob, searcher_blob, run_id)
    note = reproducibility_caveat(backend)
    if settings.time_budget is not None:
        logging.getLogger("cerebro").warning("%s", settings.budget_note())
    owned = settings.run_info()
    run_store.write_run_info(sign_pointers({
        "state_format": STATE_FORMAT,
        "run_id": run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **owned,
        "searcher": searcher_settings,
        "backend": repr(backend),
        "workers": backend.workers,
        "threads_per_worker": backend.threads_per_worker,
        "reproducible": {"across_worker_counts_and_backends": note is None, "why_not": note},
        "data": {"fingerprint": data.fingerprint(), **owned["data"],
                 "train_rows": layout.rows["train"], "val_rows": layout.rows["val"],
                 "feature_shape": list(layout.feature_shape), "feature_dtype": layout.feature_dtype,
                 "feature_columns": data.feature_columns,
                 "label_dtype": layout.label_dtype, "split_seed": data.seed,
                 "sample_order": layout.sample_order.value, "row_group_rows": layout.row_group_rows},
        "versions": {"cerebro": __version__, "torch": torch.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
    }))
    policy.start(settings.seed)
    progress, mlflow_log = observers(run_store, settings, verbose)
    Driver(policy, run_store, backend, settings, build_blob=build_blob, progress=progress).run()
    return finished(run_store, build, mlflow_log)


def reproducibility_caveat(backend: Backend) -> str | None:
    """Why this backend's settings give up invariant 2's bitwise equality across worker
    counts and backends, warned once; None when they keep it."""
    if backend.threads_per_worker == 1:
        return None
    note = (f"threads_per_worker={backend.threads_per_worker}: CPU kernels (matrix products, convolutions) add "
            f"up in an order that depends on the thread count, so this run is bitwise equal only to runs with "
            f"the same threads_per_worker; 1 (the local default) gives the same bits on any worker count")
    warnings.warn(note, stacklevel=3)
    return note


def finished(store: RunStore, build: Callable[[dict], Any] | None, mlflow_log: MLflowLog | None) -> Result:
    """The Result of a run that just ended, with its history and schedule tables written."""
    result = Result(store, build)
    if mlflow_log is not None:
        mlflow_log.log_best(result)
    for name, table in (("history", result.history), ("schedule", result.schedule)):
        try:      # copies of what the journal says: one that cannot be written is said, and the run stands
            store.write_table(name, table())
        except UnsafeFileError as error:
            logging.getLogger("cerebro").warning("%s.csv was not written: %s", name, error)
    if result.failure is not None:
        logging.getLogger("cerebro").error("%s\nThe run directory %s holds every trial's error (cb.load(...).trials)",
                                           result.failure, store.path)
    return result


def observers(store: RunStore, settings: RunSettings, verbose: int,
              resumed: bool = False) -> tuple[Progress, MLflowLog | None]:
    """What the driver tells as the run goes: the console (verbose), TensorBoard (local
    stores) and MLflow; the last also on its own, to log the best model at the end."""
    metric, mode = settings.metric, settings.mode
    chosen: list[Progress] = [ConsoleProgress(metric, mode) if verbose else NoProgress(), LiveFile(store)]
    if settings.metrics_port is not None:
        chosen.append(MetricsEndpoint(store.path, settings.metrics_port, announce=bool(verbose),
                                      host=settings.metrics_host))
    if settings.tensorboard and "://" not in store.path:
        chosen.append(TensorBoardLog(store.path))
    mlflow_log = MLflowLog(tracking_uri(settings.mlflow, store.path), store.path, metric, mode, resumed) \
        if settings.mlflow else None
    if mlflow_log is not None:
        chosen.append(mlflow_log)
    return Fanout(*chosen), mlflow_log


def pickle_build(build: Any) -> bytes:
    """``build`` (or a searcher holding it) for the workers. The user's own modules (not installed, not the standard
    library) go by value, so workers on other hosts, such as Spark executors, need not have
    them on their path."""
    own = [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType) and _is_users_module(m)]
    for module in own:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(build)
    except Exception:
        pass   # a module global that cannot be pickled: fall back to importing the modules
    finally:
        for module in own:
            cloudpickle.unregister_pickle_by_value(module)
    try:
        return cloudpickle.dumps(build)
    except Exception as error:
        raise TypeError(f"build={build!r} cannot be pickled to send to the workers: "
                        f"{type(error).__name__}: {error}") from None


_INSTALLED = tuple(os.path.abspath(sysconfig.get_paths()[key]) + os.sep
                   for key in ("purelib", "platlib", "stdlib", "platstdlib"))


def _is_users_module(module: types.ModuleType) -> bool:
    """Not __main__ (pickled by value anyway), not installed, not the standard library."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return False
    if module.__name__ == "__main__" or path is None or module.__name__.split(".")[0] == "cerebro":
        return False
    return not os.path.abspath(path).startswith(_INSTALLED + _site_directories())


def _site_directories() -> tuple[str, ...]:
    """Package directories on the path beyond this interpreter's own: an embedded Python
    (PL/Python in PostgreSQL) adds a virtual environment's with ``site.addsitedir``."""
    return tuple(os.path.abspath(entry) + os.sep for entry in sys.path
                 if os.path.basename(entry.rstrip(os.sep)) in ("site-packages", "dist-packages"))
