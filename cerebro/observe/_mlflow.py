"""MLflow logging of a run: one parent MLflow run per Cerebro run, a nested run per trial with
its config as params and its per-epoch metrics, and the best model as an artifact. By
default the tracking store is ``sqlite:///RUN_DIR/mlflow.db`` with artifacts in
``RUN_DIR/mlartifacts``; ``fit(..., mlflow="http://host:5000")`` logs to a server instead."""
from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from typing import TYPE_CHECKING, Any

from .._extras import require
from ..results import flat_config
from ..serve._pyfunc import save_pyfunc
from ..store import _files as files
from ._progress import Progress

if TYPE_CHECKING:
    from ..results import Result

EXPERIMENT = "cerebro"
STATUSES = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED", "diverged": "FAILED",
            "timeout": "FAILED"}
OUTCOMES = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


def check_mlflow(setting: Any) -> None:
    """``fit``'s ``mlflow=``: False, True, or a tracking URI; the package must be there."""
    if setting is False:
        return
    if setting is not True and not isinstance(setting, str):
        raise TypeError(f"mlflow={setting!r} must be True, False or a tracking URI such as 'http://host:5000'")
    require("mlflow=...", "mlflow")


def tracking_uri(setting: bool | str, run_dir: str) -> str:
    """The MLflow tracking URI of ``fit(mlflow=setting)`` where it is not False: True is the run's own."""
    return setting if isinstance(setting, str) else f"sqlite:///{os.path.join(run_dir, 'mlflow.db')}"


def _check_own_files(run_dir: str) -> None:
    """The run directory's MLflow store must be its own: a ``mlflow.db`` or ``mlartifacts``
    that is a link (someone else's database, a directory elsewhere) is refused, not written."""
    for name, kind in (("mlflow.db", stat.S_ISREG), ("mlartifacts", stat.S_ISDIR)):
        try:
            found = os.lstat(os.path.join(run_dir, name))
        except FileNotFoundError:
            continue
        if not kind(found.st_mode) or (kind is stat.S_ISREG and found.st_nlink != 1):
            what = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not what Cerebro makes there"
            raise files.UnsafeFileError(f"{os.path.join(run_dir, name)} is {what}, not the MLflow store Cerebro "
                                        f"makes in a run directory; nothing is written through it (remove it, or "
                                        f"give mlflow= a tracking URI)")


class MLflowLog(Progress):
    """Logs trials to MLflow as the run goes (``MlflowClient``: no global active run). A
    resumed run carries on the MLflow runs it started, found by their ``cerebro.run_dir`` tag."""

    def __init__(self, uri: str, run_dir: str, metric: str, mode: str, resumed: bool = False) -> None:
        from mlflow.tracking import MlflowClient
        if uri == tracking_uri(True, run_dir):
            _check_own_files(run_dir)
        self.client, self.run_dir, self.metric, self.mode = MlflowClient(uri), run_dir, metric, mode
        self.resumed = resumed
        location = None if "://" in uri and not uri.startswith("sqlite") else \
            f"file://{os.path.join(run_dir, 'mlartifacts')}"
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        if experiment is not None:
            if location is not None and uri == tracking_uri(True, run_dir) and \
                    experiment.artifact_location != location:
                raise ValueError(f"{run_dir}/mlflow.db keeps its artifacts at {experiment.artifact_location!r}, "
                                 f"not in the run directory ({location}): it is not the one Cerebro made, and "
                                 f"nothing is written there; remove it, or give mlflow= another tracking URI")
            self.experiment_id = experiment.experiment_id
        else:
            self.experiment_id = self.client.create_experiment(EXPERIMENT, artifact_location=location)
        self.parent = ""
        self._children: dict[str, str] = {}     # trial -> its MLflow run
        self._open: set[str] = set()             # trials created and not ended

    def start(self, run_dir: str, workers: int) -> None:
        # Only a resumed run looks for its runs: a new run in a reused directory starts afresh.
        earlier = self._runs_of(run_dir) if self.resumed else []
        parents = [r for r in earlier if "mlflow.parentRunId" not in r.data.tags]
        parent = max(parents, key=lambda r: r.info.start_time) if parents else None
        if parent is None:
            parent = self.client.create_run(self.experiment_id, run_name=os.path.basename(run_dir),
                                            tags={"cerebro.run_dir": run_dir, "cerebro.workers": str(workers)})
        else:
            self.client.update_run(parent.info.run_id, status="RUNNING")
        self.parent = parent.info.run_id
        self._children = {r.data.tags["cerebro.trial_id"]: r.info.run_id for r in earlier
                          if r.data.tags.get("mlflow.parentRunId") == self.parent}

    def _runs_of(self, run_dir: str) -> list[Any]:
        """Every MLflow run tagged with ``run_dir``, all pages."""
        quote = '"' if '"' not in run_dir else "'"
        found: list[Any] = []
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], page_token=token, max_results=1000,
                                           filter_string=f"tags.`cerebro.run_dir` = {quote}{run_dir}{quote}")
            found += page
            token = page.token
            if not token:
                return found

    def trial_created(self, trial_id: str, config: dict[str, Any], max_epochs: int) -> None:
        from mlflow.entities import Param
        if trial_id in self._children:       # resumed: its params are logged already
            self.client.update_run(self._children[trial_id], status="RUNNING")
            self._open.add(trial_id)
            return
        run = self.client.create_run(self.experiment_id, run_name=trial_id,
                                     tags={"mlflow.parentRunId": self.parent, "cerebro.trial_id": trial_id,
                                           "cerebro.run_dir": self.run_dir})
        self._children[trial_id] = run.info.run_id
        self._open.add(trial_id)
        params = [Param(key, json.dumps(value) if not isinstance(value, str) else value)
                  for key, value in flat_config(config).items()]
        self.client.log_batch(run.info.run_id, params=[*params, Param("max_epochs", str(max_epochs))])

    def epoch_end(self, trial_id: str, epoch: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self._children[trial_id],
                              metrics=[Metric(name, value, now, epoch) for name, value in metrics.items()])

    def trial_ended(self, trial_id: str, status: str, reason: str | None) -> None:
        child = self._children[trial_id]
        self._open.discard(trial_id)
        self.client.set_tag(child, "cerebro.status", status)
        if reason:
            self.client.set_tag(child, "cerebro.reason", reason.strip().splitlines()[-1][:5000])
        self.client.set_terminated(child, STATUSES.get(status, "FINISHED"))

    def log_best(self, result: Result) -> None:
        """The best trial (its best epoch's weights, its config) as the parent run's
        ``best_model`` artifact: an MLflow pyfunc model (see :mod:`cerebro.serve._pyfunc`)."""
        try:
            best = result.best
        except RuntimeError:
            return
        with tempfile.TemporaryDirectory() as scratch:
            model_dir = os.path.join(scratch, "best_model")
            save_pyfunc(best, model_dir)       # mlflow.pyfunc.load_model(".../artifacts/best_model")
            self.client.log_artifacts(self.parent, model_dir, artifact_path="best_model")
        self.client.set_tag(self.parent, "cerebro.best_trial", best.trial_id)
        self.client.log_metric(self.parent, f"best_{self.metric}", best.best_metrics[self.metric])

    def finish(self, outcome: str) -> None:
        if not self.parent:
            return
        for trial_id in sorted(self._open):      # still running when the run was interrupted or failed
            self.client.set_terminated(self._children[trial_id], OUTCOMES[outcome])
        self._open.clear()
        self.client.set_terminated(self.parent, OUTCOMES[outcome])
