"""MOP at cluster scale: the real scheduler and visit order on a simulated clock.

No processes, no torch: ``cerebro.engine.MOPScheduler`` is driven as the driver drives it
(``start_epoch`` with the run's visit order, ``assign`` with the idle workers, ``complete``
when a sub-epoch's simulated end comes), over one partition per worker unless
``--partitions`` says otherwise. Trial *i* costs ``c_i`` per train sub-epoch, drawn
log-uniform over [1, spread]; an eval sub-epoch costs ``eval_cost * c_i``. For each case
and cost draw it compares, side by side:

- ``latin``: the visit order runs use now (seeded Latin-square rotation, the default), with
  each epoch's eval visits alongside the trial's next epoch, as the driver runs trials whose
  searcher goes on whatever the metrics (grid and random search, ASHA and TPE between rungs);
- ``latin-barrier``: the same order with each epoch's evals ending before the next epoch
  starts, as for trials the searcher decides on at that epoch (Hyperband, PBT, rungs);
- ``random``: the order of runs made before (a seeded permutation per trial and epoch);
- ``dynamic``: the paper's randomized scheduler (Cerebro, VLDB 2020, Algorithm 2): an idle
  worker takes a random idle trial that has not yet visited its partition this epoch. It
  is not reproducible (the order depends on timing), so Cerebro cannot use it.

efficiency = lower bound / makespan, where lower bound = max(total work / workers, the
longest trial's own work), a trial's own work counting its eval visits as running in
parallel and only its last epoch's as following its training (one bound for every
scheme). utilization = busy time / (workers x makespan). decision time = wall time of
``complete`` + ``start_epoch`` + ``assign`` per completed sub-epoch (median and p99).

It also asks when the driver's link, rather than the workers, bounds a run: every train
sub-epoch moves the trial's state (S bytes) from the driver to a worker and back. With a
fixed dataset whose epoch takes ``--epoch-seconds`` for a cost-1 trial on one worker, a
sub-epoch lasts ``c_i * epoch_seconds / P`` s, so the driver must move
``train sub-epochs * S`` bytes each way within the makespan; the table gives the worker
count past which it cannot at B bytes/s.

    .venv/bin/python benchmarks/scale.py                       # the default grid (long)
    .venv/bin/python benchmarks/scale.py --workers 8 64 --ratios 1 2 --draws 1
    .venv/bin/python benchmarks/scale.py --workers 16 --trials 40 --partitions 20 --spread 10 \\
        --schedule /tmp/schedule.csv                           # one case, its schedule as CSV
"""
from __future__ import annotations

import argparse
import array
import csv
import heapq
import json
import math
import multiprocessing
import os
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from _hops import Hops

from cerebro.engine import EVAL, TRAIN, MOPScheduler, Task, VisitScheme, trial_name, visit_order

SCHEMES = ("latin", "latin-barrier", "random", "dynamic")


@dataclass(frozen=True)
class Case:
    workers: int
    trials: int
    partitions: int
    spread: float
    epochs: int
    evaluate: bool
    draw: int               # which cost draw (the seed of the costs and of the run)
    eval_cost: float = 0.1  # an eval sub-epoch's cost relative to a train one

    def costs(self) -> list[float]:
        """Per-trial train sub-epoch cost, log-uniform over [1, spread]."""
        if self.spread == 1:
            return [1.0] * self.trials
        rng = np.random.default_rng([self.draw, self.workers, self.trials, self.partitions])
        return [float(c) for c in np.exp(rng.uniform(0.0, math.log(self.spread), self.trials))]

    def lower_bound(self) -> float:
        costs, P, W = self.costs(), self.partitions, self.workers
        evals = P if self.evaluate else 0
        total = sum(self.epochs * c * (P + evals * self.eval_cost) for c in costs)
        # Its eval visits run in parallel, and only the last epoch's need follow its training
        # (earlier ones may overlap the next epoch): a bound for every scheme.
        own = max(c * (self.epochs * P + math.ceil(evals / W) * self.eval_cost) for c in costs)
        return max(total / W, own)


@dataclass
class Outcome:
    makespan: float = 0.0
    busy: float = 0.0
    decisions_ns: array.array = field(default_factory=lambda: array.array("q"))   # compact: millions
    rows: list[tuple[str, int, int, int, str, float, float]] | None = None   # as Result.schedule()
    train_sub_epochs: int = 0


class DynamicScheduler:
    """The paper's randomized scheduler: an idle worker takes a random idle trial that still
    has an unvisited partition (or, after training, an unevaluated one) on it this epoch.

    It matches incrementally: after each ``assign`` no idle worker has work from an idle
    trial, so only the workers and trials freed since can form new pairs.
    """

    def __init__(self, worker_partitions: dict[int, list[int]], evaluate: bool, seed: int) -> None:
        self._partitions_of = {w: list(ps) for w, ps in worker_partitions.items()}
        self._owner = {p: w for w, ps in worker_partitions.items() for p in ps}
        self.num_partitions = len(self._owner)
        self._evaluate = evaluate
        self._rng = random.Random(seed)
        self._epoch: dict[str, int] = {}
        self._todo: dict[str, set[int]] = {}       # partitions still to visit in this phase
        self._kind: dict[str, str] = {}
        self._running: dict[str, int] = {}         # trial -> sub-epochs running
        self._idle: list[str] = []                 # trials free to take work: a list for sampling
        self._slot: dict[str, int] = {}
        self._freed: list[str] = []                # trials freed since the last assign
        self._idle_workers: set[int] = set()       # idle workers already matched against
        self._finished: set[str] = set()           # trials whose epoch ended

    def start_epoch(self, trial_id: str, epoch: int) -> None:
        self._finished.discard(trial_id)
        self._epoch[trial_id], self._kind[trial_id] = epoch, TRAIN
        self._todo[trial_id] = set(range(self.num_partitions))
        self._running[trial_id] = 0
        self._set_idle(trial_id, True)

    def remove(self, trial_id: str) -> None:
        self._set_idle(trial_id, False)
        for table in (self._epoch, self._todo, self._kind, self._running):
            table.pop(trial_id, None)

    def complete(self, task: Task) -> bool:
        trial = task.trial_id
        self._running[trial] -= 1
        if self._todo[trial]:
            if task.kind == TRAIN:
                self._set_idle(trial, True)
            return False
        if self._kind[trial] == TRAIN and self._evaluate:
            self._kind[trial], self._todo[trial] = EVAL, set(range(self.num_partitions))
            self._set_idle(trial, True)
            return False
        if self._running[trial] == 0:
            self._finished.add(trial)
        return self._running[trial] == 0

    def may_start_next(self, trial_id: str) -> bool:
        return trial_id in self._finished

    def assign(self, idle_workers: Iterable[int]) -> list[Task]:
        idle = set(idle_workers)
        fresh = list(idle - self._idle_workers)
        self._idle_workers = idle
        self._rng.shuffle(fresh)
        tasks: list[Task] = []
        for worker in fresh:                       # each freed worker takes a random idle trial
            trial = self._sample(worker)
            if trial is not None:
                tasks.append(self._start(trial, worker))
        freed, self._freed = self._freed, []
        self._rng.shuffle(freed)
        for trial in freed:                        # each freed trial goes to random idle workers
            while trial in self._slot and self._idle_workers:
                todo = self._todo[trial]
                if len(todo) < len(self._idle_workers):
                    workers = sorted({self._owner[p] for p in todo} & self._idle_workers)
                else:
                    workers = sorted(w for w in self._idle_workers if any(p in todo for p in self._partitions_of[w]))
                if not workers:
                    break
                tasks.append(self._start(trial, self._rng.choice(workers)))
        return tasks

    def _start(self, trial: str, worker: int) -> Task:
        partition = next(p for p in self._partitions_of[worker] if p in self._todo[trial])
        self._todo[trial].discard(partition)
        self._running[trial] += 1
        self._idle_workers.discard(worker)
        if self._kind[trial] == TRAIN or not self._todo[trial]:
            self._set_idle(trial, False)           # evals of one trial may run side by side
        return Task(trial, self._kind[trial], self._epoch[trial], partition, worker)

    def _sample(self, worker: int) -> str | None:
        """A uniformly random idle trial with work on ``worker``: rejection sampling, and a
        scan when few match (the same distribution, only faster)."""
        mine = self._partitions_of[worker]
        for _ in range(min(len(self._idle), 16)):
            trial = self._idle[self._rng.randrange(len(self._idle))]
            if any(p in self._todo[trial] for p in mine):
                return trial
        candidates = [t for t in self._idle if any(p in self._todo[t] for p in mine)]
        return self._rng.choice(candidates) if candidates else None

    def _set_idle(self, trial: str, idle: bool) -> None:
        if idle and trial not in self._slot:
            self._slot[trial] = len(self._idle)
            self._idle.append(trial)
            self._freed.append(trial)
        elif not idle and trial in self._slot:
            slot, last = self._slot.pop(trial), self._idle.pop()
            if last != trial:
                self._idle[slot], self._slot[last] = last, slot


def _scheduler(case: Case, scheme: str) -> tuple[Any, Callable[[str, int], None], dict[str, int]]:
    """The scheme's scheduler over one layout, ``start(trial_id, epoch)`` as the driver starts
    a trial's epoch, and each trial's epoch so far."""
    W, P = case.workers, case.partitions
    layout = {w: [p for p in range(P) if p % W == w] for w in range(W)}
    epoch_of: dict[str, int] = {}
    if scheme == "dynamic":
        scheduler: Any = DynamicScheduler(layout, case.evaluate, seed=case.draw)
    else:
        scheduler = MOPScheduler(layout, evaluate=case.evaluate)
        visit = VisitScheme(scheme.removesuffix("-barrier"))
        overlap = scheme == "latin"      # as the driver runs grid and random search

    def start(trial_id: str, epoch: int) -> None:
        epoch_of[trial_id] = epoch
        if scheme == "dynamic":
            scheduler.start_epoch(trial_id, epoch)
        else:
            then = visit_order(case.draw, trial_id, epoch + 1, P, visit)[0] if epoch < case.epochs else None
            scheduler.start_epoch(trial_id, epoch, visit_order(case.draw, trial_id, epoch, P, visit), overlap, then)
    return scheduler, start, epoch_of


def simulate(case: Case, scheme: str, *, keep_rows: bool = False, max_completions: int | None = None,
             hops: Hops | None = None) -> Outcome:
    """Run every trial of ``case`` for ``case.epochs`` epochs on a simulated clock; with
    ``hops``, each sub-epoch waits for its state to arrive (:mod:`_hops`)."""
    costs = case.costs()
    scheduler, start, epoch_of = _scheduler(case, scheme)

    def cost_of(task: Task) -> float:
        return costs[int(task.trial_id[1:])] * (1.0 if task.kind == TRAIN else case.eval_cost)
    out = Outcome(rows=[] if keep_rows else None)
    # (time, tie-break, worker, task, when it finished computing where its state still went out)
    events: list[tuple[float, int, int, Task, float | None]] = []
    idle = set(range(case.workers))
    sequence = 0

    def launch(tasks: list[Task], now: float) -> None:
        nonlocal sequence
        for task in tasks:
            cost = cost_of(task)
            idle.discard(task.worker)
            sequence += 1
            begin = now if hops is None else hops.ready(task, now)
            heapq.heappush(events, (begin + cost, sequence, task.worker, task, None))

    for i in range(case.trials):
        start(trial_name(i), 1)
    launch(scheduler.assign(idle), 0.0)
    completions = 0
    while events:
        end, _, worker, task, computed = heapq.heappop(events)
        if hops is not None and computed is None:    # its state goes where hops says, in time order
            free = hops.done(task, end)
            if free > end:
                sequence += 1
                heapq.heappush(events, (free, sequence, worker, task, end))
                continue
        computed = end if computed is None else computed
        cost = cost_of(task)
        out.busy += cost
        out.train_sub_epochs += task.kind == TRAIN
        if out.rows is not None:
            out.rows.append((task.trial_id, task.epoch, task.partition, worker, task.kind, computed - cost,
                             computed))
        began = time.perf_counter_ns()
        ended = scheduler.complete(task)
        if ended and task.epoch == case.epochs:
            scheduler.remove(task.trial_id)
        elif epoch_of[task.trial_id] < case.epochs and scheduler.may_start_next(task.trial_id):
            start(task.trial_id, epoch_of[task.trial_id] + 1)
        idle.add(worker)
        tasks = scheduler.assign(idle)
        out.decisions_ns.append(time.perf_counter_ns() - began)
        launch(tasks, end)
        out.makespan = end
        completions += 1
        if max_completions is not None and completions >= max_completions:
            break
    return out


def measure(job: tuple[Case, str]) -> dict:
    case, scheme = job
    out = simulate(case, scheme)
    lower = case.lower_bound()
    decisions = sorted(out.decisions_ns)
    return {**asdict(case), "scheme": scheme, "makespan": out.makespan, "lower_bound": lower,
            "efficiency": lower / out.makespan, "utilization": out.busy / (case.workers * out.makespan),
            "decision_median_us": decisions[len(decisions) // 2] / 1e3,
            "decision_p99_us": decisions[int(len(decisions) * 0.99)] / 1e3,
            "train_sub_epochs": out.train_sub_epochs, "mean_cost": statistics.fmean(case.costs())}


def decision_time(workers: int, trials: int, completions: int) -> dict:
    """Decision time of the real scheduler with many trials, over the first completions."""
    case = Case(workers, trials, workers, 10.0, 3, True, 0)
    decisions = sorted(simulate(case, "latin", max_completions=completions).decisions_ns)
    return {"workers": workers, "trials": trials, "completions": len(decisions),
            "median_us": decisions[len(decisions) // 2] / 1e3, "p99_us": decisions[int(len(decisions) * 0.99)] / 1e3}


def link_bound(rows: list[dict], state_bytes: float, link_bytes_per_s: float, epoch_seconds: float) -> list[dict]:
    """For each simulated latin run: seconds the driver's link needs (each direction) against
    the simulated makespan in seconds; the link bounds the run where it needs more."""
    out = []
    for r in rows:
        if r["scheme"] != "latin":
            continue
        makespan_s = r["makespan"] * epoch_seconds / r["partitions"]
        link_s = r["train_sub_epochs"] * state_bytes / link_bytes_per_s
        out.append({"workers": r["workers"], "trials": r["trials"], "spread": r["spread"], "evaluate": r["evaluate"],
                    "draw": r["draw"], "makespan_s": makespan_s, "link_s": link_s, "link_bound": link_s > makespan_s})
    return out


def crossover_workers(state_bytes: float, link_bytes_per_s: float, epoch_seconds: float, mean_cost: float) -> float:
    """Workers W (one partition each, makespan at the lower bound, trials >= workers) past
    which the link bounds the run: per trial-epoch the link moves W states in
    W * S / B s while the workers take mean_cost * epoch_seconds / W s per trial-epoch."""
    return math.sqrt(link_bytes_per_s * epoch_seconds * mean_cost / state_bytes)


def network_run(job: tuple[Case, float, bool, float, float, float]) -> dict:
    """One latin run of ``case`` with its states moved as :mod:`_hops` models (``direct`` or
    through the driver), ``state_mb`` states over links of the given Gbit/s."""
    case, state_mb, direct, worker_gbit, driver_gbit, epoch_seconds = job
    unit = epoch_seconds / case.partitions          # seconds of a cost-1 train sub-epoch
    hops = Hops(direct, state_mb * 1e6 / (worker_gbit * 1e9 / 8) / unit,
                state_mb * 1e6 / (driver_gbit * 1e9 / 8) / unit, case.partitions)
    out = simulate(case, "latin", hops=hops)
    return {"workers": case.workers, "trials": case.trials, "state_mb": state_mb,
            "hops": "direct" if direct else "hub", "efficiency": case.lower_bound() / out.makespan,
            "utilization": out.busy / (case.workers * out.makespan), "states_moved": hops.moved, "sub_epoch_s": unit}


def network_table(args: argparse.Namespace) -> list[dict]:
    """Efficiency with the network modelled, hub against direct hops, per worker count and
    state size (one trial per worker, the first ``--spread``, evals on)."""
    cases = [Case(w, w, args.partitions or w, args.spread[0], args.epochs, args.evaluate is not False, args.seed,
                  args.eval_cost) for w in args.workers]
    jobs = [(case, mb, direct, args.worker_gbit, args.link_gbit, args.epoch_seconds)
            for case in cases for mb in args.state_mb for direct in (False, True)]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        rows = sorted(pool.map(network_run, jobs), key=lambda r: (r["state_mb"], r["workers"], r["hops"] != "hub"))
    print(f"\nthe network modelled: workers' links {args.worker_gbit:g} Gbit/s, the driver's {args.link_gbit:g} "
          f"Gbit/s, a cost-1 epoch {args.epoch_seconds:g} s on one worker, one trial per worker:")
    print(f"{'state MB':>8} {'workers':>7} | {'hub eff':>7} {'direct eff':>10} | {'sub-epoch s':>11} "
          f"{'states moved':>12}")
    for hub, direct in zip(rows[::2], rows[1::2]):
        print(f"{hub['state_mb']:>8g} {hub['workers']:>7} | {hub['efficiency']:>7.3f} "
              f"{direct['efficiency']:>10.3f} | {hub['sub_epoch_s']:>11.1f} {direct['states_moved']:>12}")
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """One line per case: each scheme's mean and worst efficiency over the cost draws."""
    cases: dict[tuple, dict] = {}
    for r in rows:
        key = (r["workers"], r["trials"], r["partitions"], r["spread"], r["evaluate"])
        line = cases.setdefault(key, dict(zip(("workers", "trials", "partitions", "spread", "evaluate"), key)))
        line.setdefault(r["scheme"], []).append(r)
    summary = []
    for line in cases.values():
        for scheme in SCHEMES:
            runs = line.pop(scheme, [])
            if runs:
                line[f"{scheme}_efficiency"] = statistics.fmean(r["efficiency"] for r in runs)
                line[f"{scheme}_worst"] = min(r["efficiency"] for r in runs)
                line[f"{scheme}_utilization"] = statistics.fmean(r["utilization"] for r in runs)
                line[f"{scheme}_decision_p99_us"] = max(r["decision_p99_us"] for r in runs)
                line[f"{scheme}_decision_median_us"] = statistics.median(r["decision_median_us"] for r in runs)
        summary.append(line)
    return summary


def print_table(summary: list[dict], schemes: list[str]) -> None:
    head = f"{'workers':>7} {'trials':>6} {'parts':>5} {'spread':>6} {'eval':>5}"
    for s in schemes:
        head += f" | {s + ' eff (worst)':>19} {'util':>5} {'p50/p99 µs':>12}"
    print(head)
    for line in summary:
        text = (f"{line['workers']:>7} {line['trials']:>6} {line['partitions']:>5} {line['spread']:>5g}x "
                f"{'yes' if line['evaluate'] else 'no':>5}")
        for s in schemes:
            text += (f" | {line[f'{s}_efficiency']:>11.3f} ({line[f'{s}_worst']:.3f}) "
                     f"{line[f'{s}_utilization']:>5.3f} "
                     f"{line[f'{s}_decision_median_us']:>5.0f}/{line[f'{s}_decision_p99_us']:<6.0f}")
        print(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--ratios", type=int, nargs="+", default=[1, 2, 4], help="trials per worker")
    parser.add_argument("--trials", type=int, nargs="+", help="trial counts (instead of --ratios)")
    parser.add_argument("--partitions", type=int, help="partitions (default: one per worker)")
    parser.add_argument("--spread", type=float, nargs="+", default=[1.0, 10.0], help="cost spread, max/min")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--draws", type=int, default=3, help="cost draws per case")
    parser.add_argument("--seed", type=int, default=0, help="the first draw's seed")
    parser.add_argument("--evaluate", action=argparse.BooleanOptionalAction, default=None,
                        help="with (or without) eval sub-epochs; both if not given")
    parser.add_argument("--eval-cost", type=float, default=0.1)
    parser.add_argument("--scheme", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    parser.add_argument("--decision-workers", type=int, default=1024)
    parser.add_argument("--decision-trials", type=int, default=10_000)
    parser.add_argument("--decision-completions", type=int, default=200_000)
    parser.add_argument("--state-mb", type=float, nargs="+", default=[100.0, 300.0])
    parser.add_argument("--link-gbit", type=float, default=10.0, help="the driver's link")
    parser.add_argument("--worker-gbit", type=float, default=10.0, help="each worker's link (--network)")
    parser.add_argument("--network", action="store_true",
                        help="only the network model: hub against direct hops, per --workers and --state-mb")
    parser.add_argument("--epoch-seconds", type=float, default=3600.0,
                        help="one epoch of a cost-1 trial over all the data on one worker")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "scale.json"))
    parser.add_argument("--schedule", help="write the schedule of the (single) case and scheme as CSV")
    args = parser.parse_args(argv)
    for name in ("workers", "ratios", "trials", "draws", "epochs", "jobs", "partitions"):
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and value < 1:
                parser.error(f"--{name}={value} must be at least 1")
    if args.partitions is not None and args.partitions < max(args.workers):
        parser.error(f"--partitions={args.partitions} is fewer than --workers={max(args.workers)}: "
                     f"every worker needs a partition")
    if any(s < 1 for s in args.spread):
        parser.error(f"--spread={args.spread} must be at least 1")
    return args


def cases_of(args: argparse.Namespace) -> list[Case]:
    evaluates = [True, False] if args.evaluate is None else [args.evaluate]
    cases = []
    for workers in args.workers:
        counts = args.trials or [r * workers for r in args.ratios]
        for trials in counts:
            for spread in args.spread:
                for evaluate in evaluates:
                    for draw in range(args.seed, args.seed + args.draws):
                        cases.append(Case(workers, trials, args.partitions or workers, spread, args.epochs,
                                          evaluate, draw, args.eval_cost))
    return cases


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.network:
        rows = network_table(args)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"command": shlex.join([sys.executable, *sys.argv]), "network": rows}, f, indent=1)
        return 0
    cases = cases_of(args)
    if args.schedule:
        if len(cases) != 1 or len(args.scheme) != 1:
            print("--schedule needs one case and one --scheme", file=sys.stderr)
            return 2
        out = simulate(cases[0], args.scheme[0], keep_rows=True)
        with open(args.schedule, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["trial_id", "epoch", "partition", "worker", "kind", "start", "end"])
            writer.writerows(out.rows)
    jobs = [(case, scheme) for case in cases for scheme in args.scheme]
    # The biggest first, so the pool's last jobs are short.
    jobs.sort(key=lambda job: -job[0].trials * job[0].partitions)
    started = time.monotonic()
    rows = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for row in pool.imap_unordered(measure, jobs):
            rows.append(row)
            print(f"[{len(rows)}/{len(jobs)} {time.monotonic() - started:.0f} s] {row['scheme']} "
                  f"{row['workers']} workers {row['trials']} trials spread {row['spread']:g} "
                  f"eval {row['evaluate']} draw {row['draw']}: efficiency {row['efficiency']:.3f}",
                  file=sys.stderr, flush=True)
    summary = summarize(sorted(rows, key=lambda r: (r["workers"], r["trials"], r["spread"], not r["evaluate"])))
    print_table(summary, args.scheme)

    decisions = decision_time(args.decision_workers, args.decision_trials, args.decision_completions)
    print(f"\ndecision time, latin, {decisions['workers']} workers, {decisions['trials']} trials, first "
          f"{decisions['completions']} completions: median {decisions['median_us']:.1f} µs, "
          f"p99 {decisions['p99_us']:.1f} µs")

    link = 1e9 * args.link_gbit / 8
    crossovers = []
    mean_cost = statistics.fmean(r["mean_cost"] for r in rows)
    print(f"\ndriver link {args.link_gbit:g} Gbit/s, an epoch of a cost-1 trial = {args.epoch_seconds:g} s "
          f"on one worker (mean trial cost {mean_cost:.2f}):")
    for mb in args.state_mb:
        bound = link_bound(rows, mb * 1e6, link, args.epoch_seconds)
        first = min((b["workers"] for b in bound if b["link_bound"]), default=None)
        crossover = crossover_workers(mb * 1e6, link, args.epoch_seconds, mean_cost)
        crossovers.append({"state_mb": mb, "crossover_workers": crossover, "first_simulated_link_bound": first,
                           "runs": bound})
        print(f"  state {mb:g} MB: the link bounds the makespan from about {crossover:.0f} workers; "
              f"first simulated worker count where it does: {first}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": shlex.join([sys.executable, *sys.argv]), "seconds": time.monotonic() - started,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                   "summary": summary, "runs": rows, "decision_time": decisions, "driver_link": crossovers},
                  f, indent=1)
    print(f"\nwrote {args.out} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
