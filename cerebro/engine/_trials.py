"""The trial book: each live trial's lifecycle, as pure logic (no processes, no sockets).

A trial is created from the searcher's request, trains epoch after epoch (the scheduler
plans its sub-epochs), and at each epoch end its metrics are the row-weighted means of its
sub-epochs'; the searcher then says whether it goes on, stops, or waits for a decision
(:meth:`TrialBook.apply_decisions`), possibly an exploit of another trial's state (PBT).
Where the searcher goes on whatever the metrics (``continues_after``), the next epoch starts
as soon as the training ends, and the eval visits run alongside it on the state the
training ended with (an :class:`Evaluation`): evals then never hold up the trial, and
nothing it computes changes.
A trial ends completed, stopped, failed, diverged or timeout; failures count against
``max_failures``. Everything it decides goes out through ``recorder`` as typed events.
"""
from __future__ import annotations

import functools
import math
import traceback
from collections.abc import Iterable

from ..store import (
    Decided,
    EpochEnd,
    StateLost,
    TrialCreated,
    TrialEnded,
    TrialStatus,
    TrialTakenUp,
    improved,
)
from ..worker import Sums
from ..worker._exact import ExactMetrics
from ._decisions import Decisions
from ._epoch_rules import LEARNING_RATE, USER_STOP, diverged, mean_metrics, merged_states, plateau
from ._errors import TooManyFailuresError
from ._interface import Decision, SearchPolicy, TrialRequest
from ._recorder import Recorder
from ._retention import Retention
from ._scheduler import TRAIN, MOPScheduler, Task
from ._search_state import SearchStateLog
from ._seeds import trial_name
from ._settings import RunSettings
from ._shelf import StateShelf
from ._trial import Evaluation, Phase, Trial
from ._visit_order import visit_order
from ._warm import WarmStarts


class TrialBook(Decisions):
    """The live trials of a run, and what happens to them at each epoch end."""

    def __init__(self, policy: SearchPolicy, scheduler: MOPScheduler, settings: RunSettings,
                 recorder: Recorder, exact: ExactMetrics | None = None, shelf: StateShelf | None = None) -> None:
        self.policy, self.scheduler, self.settings = policy, scheduler, settings
        self.recorder = recorder
        self.exact = exact          # computes torchmetrics Metric values from merged states
        self.shelf = shelf or StateShelf()      # the trials' states between hops
        self.live: dict[str, Trial] = {}
        self.created = 0
        self.failures: list[str] = []
        self.suggest_due = True
        self.decide_due = False
        self._search_state = SearchStateLog()
        self.retention = Retention(settings, recorder)
        self.draining = False     # the run stops: no new trial, no new epoch (see drained)
        self._warm = WarmStarts(settings.warm_start) if settings.warm_start is not None else None

    # --- creation -----------------------------------------------------------------------
    def add_trials(self) -> None:
        """Ask the searcher for trials at the start and after an epoch or a trial ended."""
        if not self.suggest_due or self.draining:
            return
        self.suggest_due = False
        requests = self.policy.suggest()
        if requests:
            self.write_search_state()
        for request in requests:
            self.create(request)

    def create(self, request: TrialRequest) -> Trial:
        """Start a new trial, named in creation order, at its first epoch."""
        trial = Trial(trial_name(self.created), dict(request.config), request.max_epochs)
        self.created += 1
        self.live[trial.trial_id] = trial
        self.recorder.write_config(trial.trial_id, trial.config)
        warm = self._warm.take(trial.config) if self._warm is not None else None
        if warm is not None:
            # Its epoch-0 checkpoint, queued before the event: a journal that says the trial was
            # warm-started always has the state for resume to start it from (writes keep order).
            trial.hold(self.shelf.put(warm[0]), 1)
            self.recorder.write_checkpoint(trial.trial_id, trial.state, 0)
        self.recorder.emit(TrialCreated(trial.trial_id, trial.config, trial.max_epochs, self.recorder.now(),
                                        warm[1] if warm else None))
        self.start_epoch(trial)
        return trial

    def adopt(self, trial: Trial) -> None:
        """Take up a trial of the run before a crash (resume)."""
        self.live[trial.trial_id] = trial
        self.recorder.emit(TrialTakenUp(trial.trial_id, trial.config, trial.max_epochs))

    def start_epoch(self, trial: Trial) -> None:
        """Schedule ``trial``'s next epoch in its visit order (from the seed, never timing);
        while the run stops, park it instead: a resume starts that epoch."""
        if self.draining:
            trial.move(Phase.PARKED)
            return
        trial.move(Phase.TRAINING)
        trial.epoch += 1
        trial.train_sums, trial.eval_sums = {}, {}
        trial.epoch_start = trial.version
        continues = getattr(self.policy, "continues_after", None)
        trial.overlap = (self.settings.evaluate and trial.catch_up < trial.epoch < trial.max_epochs
                         and trial.epoch_metric is None
                         and continues is not None and continues(trial.trial_id, trial.epoch))
        order = functools.partial(visit_order, self.settings.seed, trial.trial_id,
                                  num_partitions=self.settings.num_partitions, scheme=self.settings.visit_scheme)
        then = order(trial.epoch + 1)[0] if trial.epoch < trial.max_epochs else None
        self.scheduler.start_epoch(trial.trial_id, trial.epoch, order(trial.epoch), trial.overlap, then)

    # --- sub-epochs ---------------------------------------------------------------------
    def sub_epoch_done(self, task: Task, worker: int, sums: Sums, state: object,
                       learning_rate: float | None = None, epoch_metric: str | None = None) -> None:
        """``task`` ran on ``worker``; at the trial's epoch end, report it to the searcher.
        ``state``: the trained state, or None where it stayed on ``worker`` (direct hops)."""
        trial = self.live.get(task.trial_id)
        if trial is None:      # an eval visit of a trial that ended meanwhile
            return
        trial.epoch_metric = epoch_metric
        if trial.phase is Phase.ENDING and task.epoch == trial.epoch:
            return             # it ends once its earlier epochs' evals are in
        if task.kind == TRAIN:
            for holding in trial.holdings():
                holding.holders.discard(worker)
            if state is None:
                trial.version += 1
            else:
                trial.state = None     # let go of first: the shelf's room is for states still to be used
                trial.hold(self.shelf.put(state), trial.version + 1)
            trial.holders = {worker}
            trial.retune, trial.learning_rate = False, learning_rate
            trial.train_sums[task.partition] = sums
            if not math.isfinite(sums.loss):
                self.end(trial, TrialStatus.DIVERGED, f"train loss became {sums.loss / max(sums.rows, 1)} in "
                                                      f"epoch {task.epoch} on partition {task.partition}", task.epoch)
                return
        else:
            evaluation = trial.evaluations.get(task.epoch)
            (trial.eval_sums if evaluation is None else evaluation.eval_sums)[task.partition] = sums
        if self.scheduler.complete(task):
            if task.epoch == trial.epoch and trial.evaluations:
                trial.move(Phase.WAITING)      # epochs are reported in order
            else:
                self._end_epoch(trial, task.epoch)
        if trial.trial_id in self.live and trial.phase is Phase.TRAINING and trial.overlap \
                and trial.epoch_metric is None and not self.draining and self.scheduler.may_start_next(trial.trial_id):
            # Training done, evals to run: they go on alongside the next epoch.
            trial.evaluations[trial.epoch] = Evaluation(trial.held_state(), trial.version, set(trial.holders),
                                                        trial.train_sums, trial.eval_sums, trial.learning_rate)
            self.start_epoch(trial)

    def worker_lost(self, task: Task, reason: str) -> bool:
        """``task`` will not finish: its worker was lost. A trial whose sub-epochs were on
        ``max_trial_losses`` lost workers is taken for their cause (it crashes or hangs its
        worker) and fails, not the run; returns True then."""
        self.scheduler.abort(task)
        trial = self.live.get(task.trial_id)
        if trial is None:
            return False
        trial.lost_with.append(reason)
        if len(trial.lost_with) < self.settings.limits.max_trial_losses:
            return False
        self.end(trial, TrialStatus.FAILED, f"lost the {len(trial.lost_with)} workers that ran it: "
                                            + "; ".join(trial.lost_with), task.epoch)
        return True

    def forget_holders(self, worker: int | None = None, trial_ids: Iterable[str] | None = None) -> None:
        """``worker`` (None: every worker) no longer holds the state of ``trial_ids`` (None:
        of any trial): it was lost, restarted, or evicted them from its cache."""
        trials = self.live.values() if trial_ids is None else filter(None, map(self.live.get, trial_ids))
        for trial in trials:
            for holding in trial.holdings():
                if worker is None:
                    holding.holders.clear()
                else:
                    holding.holders.discard(worker)

    def handed_back(self, trial_id: str, version: int, state: object) -> None:
        """A worker's outbox let go of ``trial_id``'s state ``version``: where it is still the
        trial's latest, the driver keeps it (else that state would be lost with the outbox)."""
        trial = self.live.get(trial_id)
        if trial is not None and version == trial.version and trial.state_version < version:
            trial.state = None
            trial.hold(self.shelf.put(state), version)

    def rewind(self, trial: Trial, reason: str) -> None:
        """Direct hops: ``trial``'s latest state was lost (``reason``). It goes back to the
        driver's copy and trains again the partitions of this epoch since that copy; their
        seeds are the same, so what they compute is bitwise the same (invariant 2)."""
        kept = trial.state_version - trial.epoch_start
        assert kept >= 0, f"{trial.trial_id}: the driver's state predates its epoch {trial.epoch}"
        again = self.scheduler.rewind(trial.trial_id, kept)
        for partition in again:
            trial.train_sums.pop(partition, None)
        trial.version, trial.holders = trial.state_version, set()
        self.recorder.emit(StateLost(trial.trial_id, trial.epoch, again, reason, self.recorder.now()))

    # --- epoch ends and decisions -------------------------------------------------------
    def _end_epoch(self, trial: Trial, epoch: int) -> None:
        """Every sub-epoch of ``trial``'s ``epoch`` is done: checkpoint it, journal its metrics
        and ask the searcher (epochs redone after a resume only checkpoint and go on)."""
        if epoch < trial.epoch:
            self._end_evaluation(trial, epoch)
            return
        if trial.epoch <= trial.catch_up:      # resume: journaled and reported before the crash
            trial.last_metrics = (trial.epoch, trial.recovered.epoch_metrics.get(trial.epoch, {}))
            self.recorder.write_checkpoint(trial.trial_id, trial.state, trial.epoch,
                                           best=trial.best is not None and trial.best[0] == trial.epoch)
            if trial.epoch < trial.catch_up:
                self.start_epoch(trial)
            else:
                trial.catch_up = 0
                self.carry_on(trial, trial.recovered)
            return
        decision = self._report(trial, trial.epoch, trial.state, trial.train_sums, trial.eval_sums,
                                trial.learning_rate)
        if decision is Decision.PAUSE:
            trial.move(Phase.PAUSED)
        elif decision is not None:
            self.go_on(trial, decision)

    def _end_evaluation(self, trial: Trial, epoch: int) -> None:
        """The evals of ``epoch`` ended while ``trial`` trains a later epoch. The searcher said
        it goes on whatever the metrics, but they may have diverged, or it may stop it anyway."""
        evaluation = trial.evaluations.pop(epoch)
        decision = self._report(trial, epoch, evaluation.state, evaluation.train_sums, evaluation.eval_sums,
                                evaluation.learning_rate)
        if decision is Decision.CONTINUE and trial.stop_epoch is not None and epoch >= trial.stop_epoch:
            self.end(trial, TrialStatus.STOPPED, USER_STOP)
        elif decision is Decision.STOP:
            self.end(trial, TrialStatus.STOPPED, trial.stop_reason or self.policy.stop_reason(trial.trial_id))
        elif decision is Decision.PAUSE:
            raise RuntimeError(f"{type(self.policy).__name__} paused {trial.trial_id} after epoch {epoch}, "
                               f"where its continues_after promised CONTINUE whatever the metrics")
        elif decision is None:
            pass                               # diverged: ended
        elif trial.phase is Phase.ENDING and trial.ending is not None:      # set with the phase
            self.end(trial, *trial.ending)
        elif trial.phase is Phase.WAITING:
            self._end_epoch(trial, trial.epoch)

    def _report(self, trial: Trial, epoch: int, state: object, train_sums: dict[int, Sums],
                eval_sums: dict[int, Sums], learning_rate: float | None) -> Decision | None:
        """Checkpoint and journal ``epoch`` and ask the searcher; None where it diverged (ended)."""
        metrics = self.epoch_metrics(trial, epoch, train_sums, eval_sums)
        if metrics is None:
            return None
        if learning_rate is not None:
            metrics[LEARNING_RATE] = learning_rate
        trial.last_metrics = (epoch, metrics)
        best = improved(trial.best, epoch, metrics, self.settings.metric, self.settings.mode)
        trial.best = best or trial.best
        self.recorder.write_checkpoint(trial.trial_id, state, epoch, best=best is not None)
        self.recorder.emit(EpochEnd(trial.trial_id, epoch, metrics, self.recorder.now()))
        self.suggest_due = True
        bad = diverged(metrics)
        if bad:
            self.end(trial, TrialStatus.DIVERGED, f"{bad} is {metrics[bad]} after epoch {epoch}")
            return None
        decision = self.policy.report(trial.trial_id, epoch, metrics)
        trial.improved_at, decision, trial.stop_reason = plateau(trial.improved_at, epoch, trial.max_epochs, metrics,
                                                                 decision, self.settings)
        self.recorder.emit(Decided(trial.trial_id, epoch, decision.value))
        self.decide_due = True
        return decision

    def epoch_metrics(self, trial: Trial, epoch: int, train_sums: dict[int, Sums],
                      eval_sums: dict[int, Sums]) -> dict[str, float] | None:
        """``epoch``'s metrics: row-weighted means of the sub-epochs' sums, and the exact
        (torchmetrics) ones from their merged states; None where the user's Metric failed,
        which ends ``trial`` failed (not the run). :mod:`._simulate` takes them from its objective."""
        metrics = {**mean_metrics("train", train_sums), **mean_metrics("val", eval_sums)}
        try:
            for prefix, sums in (("train", train_sums), ("val", eval_sums)):
                states = merged_states(sums)
                if states and self.exact is not None:
                    metrics.update(self.exact.values(trial.config, prefix, states))
        except Exception:
            self.end(trial, TrialStatus.FAILED, traceback.format_exc(), epoch)
            return None
        return metrics

    def drained(self) -> bool:
        """The run is stopping and every live trial waits at an epoch boundary."""
        return self.draining and all(t.phase in (Phase.PARKED, Phase.PAUSED) for t in self.live.values())

    # --- ends ---------------------------------------------------------------------------
    def end(self, trial: Trial, status: TrialStatus, reason: str | None, epoch: int | None = None) -> None:
        """``trial`` ends as ``status``; too many failures stop the run (``max_failures``).
        A failure in ``epoch``, the one it trains in, while an earlier epoch's evals still run
        ends it once they are in and reported, as it would have without the overlap."""
        if epoch == trial.epoch and trial.evaluations and status.is_failure:
            if trial.phase is not Phase.ENDING:
                trial.move(Phase.ENDING)
                trial.ending = (status, reason)
                self.scheduler.stop_training(trial.trial_id)
            return
        del self.live[trial.trial_id]
        self.scheduler.remove(trial.trial_id)
        self.suggest_due = self.decide_due = True
        if reason and status is TrialStatus.FAILED:
            self.recorder.write_error(trial.trial_id, reason)
        self.recorder.emit(TrialEnded(trial.trial_id, status, reason, self.recorder.now()))
        self.policy.trial_ended(trial.trial_id, status)
        self.retention.ended(trial.trial_id, trial.best[1] if trial.best and not status.is_failure else None)
        if status.is_failure:
            self.failures.append(f"{trial.trial_id} {status} ({(reason or '').strip().splitlines()[-1][:200]})")
            limit = self.settings.limits.max_failures
            if limit is not None and len(self.failures) > limit:
                raise TooManyFailuresError(
                    f"{len(self.failures)} trials ended failed, diverged or timeout, more than max_failures="
                    f"{limit}: {'; '.join(self.failures)}. The run stopped; its journal and "
                    f"checkpoints are in {self.recorder.path}")
