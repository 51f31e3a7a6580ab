"""Cerebro's searchers against Optuna, SMAC and Syne Tune on offline multi-fidelity problems.

Every method gets the same budget of trial-epochs (``--budget`` times the problem's
``max_epochs``) on each problem of ``_mf_problems`` (MF-Hartmann 3-D and 6-D, LCBench through
YAHPO's surrogate), for ``--seeds`` seeds. Cerebro's searchers run through ``cb.simulate`` on 1
and 4 workers; the peers (``_peers``; ``pip install '.[peers]'``) one evaluation at a time, in
their own loops. A peer that is not installed is skipped, saying so.

At each point of the budget a method's incumbent is the (trial, epoch) with the best metric it
has seen (what it would hand back, as ``result.best`` does), and its simple regret is that
model's noiseless value minus the problem's optimum. The script prints, and writes as JSON and
Markdown: the mean, standard error and median of the regret at 10, 25, 50 and 100 % of the
budget, each method's mean rank per family, whether each Cerebro searcher decided the same
trials, configs, statuses and epochs on 1 and 4 workers, and the issue's targets; and a figure
of the anytime curves.

Usage::

    .venv/bin/python benchmarks/search_vs_peers.py                # the full benchmark (BENCHMARKS.md)
    .venv/bin/python benchmarks/search_vs_peers.py --quick        # seconds: 2 problems, 2 seeds
    .venv/bin/python benchmarks/search_vs_peers.py --peers optuna_random --seeds 3
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _mf_problems as mf  # noqa: E402
import _peers  # noqa: E402
from _report import provenance, write_json  # noqa: E402

import cerebro as cb  # noqa: E402

FRACTIONS = (0.1, 0.25, 0.5, 1.0)
GRID = np.linspace(0.02, 1.0, 50)          # the anytime curves' points, as fractions of the budget
# Like for like: on 1 worker every method runs one trial at a time (Cerebro's searchers with
# max_concurrent=1, the peers in their own sequential loops); on 4 workers, 4 trials are in
# flight (Cerebro's max_concurrent=4; the peers' "@4w": a new trial starts as one ends, seeing
# what has ended by then). ASHA's default is 16, TPE's and BOHB's 8: 4 keeps 4 workers busy.
WORKERS = {1: 1, 4: 4}                     # workers -> max_concurrent
CEREBRO = ("random", "hyperband", "asha", "tpe", "bohb")


def no_build(config: dict) -> None:
    """The searchers' build: a simulated run never calls it."""


# Trial-epochs a trial of each searcher spends on these problems, about (ASHA 3.5-4.6, TPE with
# ASHA's rule 12-21, BOHB 7-8): the first guess of the trials a run needs to spend its budget.
EPOCHS_PER_TRIAL = {"asha": 3, "tpe": 8, "bohb": 5}


def cerebro_searcher(kind: str, problem: mf.Problem, budget: int, concurrent: int,
                     more: int = 1) -> cb.Searcher | None:
    """Cerebro's searcher ``kind`` on ``problem`` with at most ``concurrent`` trials live, and
    ``more`` times the trials it is expected to need to spend ``budget`` (the run is cut
    there); None where this Cerebro has no such searcher."""
    space, epochs, objective = problem.space(), problem.max_epochs, {"metric": problem.metric, "mode": "min"}
    trials = more * math.ceil(budget / EPOCHS_PER_TRIAL.get(kind, epochs))
    bandit = {"max_epochs": epochs, "grace_period": 1, "reduction_factor": 3, "max_concurrent": concurrent}
    if kind == "random":
        return cb.RandomSearch(no_build, space, num_trials=math.ceil(budget / epochs), epochs=epochs, **objective)
    if kind == "hyperband":          # one Hyperband iteration: it ends when its brackets do
        return cb.Hyperband(no_build, space, max_epochs=epochs, eta=3, **objective)
    if kind == "asha":
        return cb.ASHA(no_build, space, num_trials=trials, **bandit, **objective)
    if kind == "tpe":                 # TPE whose trials ASHA's rule stops
        return cb.TPESearch(no_build, space, num_trials=trials, epochs=epochs, grace_period=1, reduction_factor=3,
                            max_concurrent=concurrent, **objective)
    bohb = getattr(cb, "BOHB", None)
    return None if bohb is None else bohb(no_build, space, num_trials=trials, **bandit, **objective)


def simulate(kind: str, problem: mf.Problem, seed: int, workers: int, budget: int,
             concurrent: int) -> tuple[list, list] | None:
    """The steps of one simulated run of Cerebro's ``kind`` on ``workers`` with at most
    ``concurrent`` trials live, cut at ``budget``, and its decisions (every trial's id, config,
    status and epochs, and every epoch's metric); with twice the trials while a run ends before
    its budget is spent (Hyperband ends when its brackets do). None where this Cerebro has no ``kind``."""
    more = 1
    while (searcher := cerebro_searcher(kind, problem, budget, concurrent, more)) is not None:
        steps, decisions = _simulate(searcher, problem, seed, workers, budget)
        if len(steps) == budget or kind in ("random", "hyperband"):
            return steps, decisions
        more *= 2
    return None


def _simulate(searcher: cb.Searcher, problem: mf.Problem, seed: int, workers: int, budget: int) -> tuple[list, list]:
    with tempfile.TemporaryDirectory() as scratch:
        result = cb.simulate(searcher, problem.objective, workers=workers, seed=seed,
                             store=os.path.join(scratch, "run"))
        ended = result.anytime()          # the epochs in the order they ended, in simulated time
        configs = {t.trial_id: t.config for t in result.trials}
        statuses = {t.trial_id: str(t.status) for t in result.trials}
    rows = list(zip(ended["trial_id"], ended["epoch"], ended["value"]))
    steps = [_peers.Step(1, float(value), problem.regret(configs[trial], int(epoch)))
             for trial, epoch, value in rows[:budget]]
    epochs = ended.groupby("trial_id")["epoch"].max().to_dict()
    decisions = [(t, json.dumps(configs[t], sort_keys=True), statuses[t], int(epochs.get(t, 0))) for t in configs]
    return steps, sorted(decisions) + sorted((t, int(e), float(v)) for t, e, v in rows)


def regrets(steps: list[_peers.Step], budget: int, fractions: Any) -> list[float]:
    """The incumbent's regret once each fraction of ``budget`` is spent (NaN before any step)."""
    spent = np.cumsum([s.cost for s in steps])
    values = np.array([s.value for s in steps])
    out = []
    for fraction in fractions:
        seen = int(np.searchsorted(spent, round(fraction * budget), side="right"))
        out.append(steps[int(np.argmin(values[:seen]))].regret if seen else math.nan)
    return out


def cell(job: tuple[str, int, int, tuple[str, ...]]) -> dict[str, Any]:
    """Every method on one problem with one seed."""
    name, seed, budget, peers = job
    warnings.filterwarnings("ignore")          # the peers' experimental-feature and convergence chatter
    problem = {p.name: p for p in mf.problems()}[name]
    out: dict[str, Any] = {"problem": name, "seed": seed, "methods": {}, "same_decisions": {}}

    def record(method: str, steps: list, seconds: float) -> None:
        out["methods"][method] = {"regret": regrets(steps, budget, FRACTIONS), "curve": regrets(steps, budget, GRID),
                                  "spent": int(sum(s.cost for s in steps)), "seconds": seconds}
    for kind in CEREBRO:
        for workers, concurrent in WORKERS.items():
            started = time.perf_counter()
            ran = simulate(kind, problem, seed, workers, budget, concurrent)
            if ran is None:
                break
            record(f"cerebro_{kind}@{workers}w", ran[0], time.perf_counter() - started)
        if ran is not None:           # the 4-worker run's decisions, made again on 1 worker
            again = simulate(kind, problem, seed, 1, budget, WORKERS[max(WORKERS)])
            out["same_decisions"][kind] = again is not None and again[1] == ran[1]
    for peer in peers:
        started = time.perf_counter()
        steps = _peers.run_peer(peer, problem, budget, seed)
        record(peer, steps, time.perf_counter() - started)
    return out


def stats(values: list[float]) -> dict[str, float]:
    """Mean, standard error and median over seeds."""
    v = np.array(values, dtype=float)
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return {"mean": float(v.mean()), "se": se, "median": float(np.median(v))}


def summarize(cells: list[dict[str, Any]], families: dict[str, str]) -> dict[str, Any]:
    """Per problem and method: regret statistics at each fraction and the mean curve; per
    family and method: the mean rank at each fraction (over problems and seeds, ties shared)."""
    from scipy.stats import rankdata
    problems: dict[str, Any] = {}
    ranks: dict[str, dict[str, list[list[float]]]] = {}
    for c in cells:
        methods = sorted(c["methods"])
        table = np.array([c["methods"][m]["regret"] for m in methods])
        rank = np.apply_along_axis(rankdata, 0, np.nan_to_num(table, nan=math.inf))
        for m, r in zip(methods, rank):
            ranks.setdefault(families[c["problem"]], {}).setdefault(m, []).append(list(r))
        for m in methods:
            entry = problems.setdefault(c["problem"], {}).setdefault(m, {"regret": [], "curve": [], "spent": []})
            entry["regret"].append(c["methods"][m]["regret"])
            entry["curve"].append(c["methods"][m]["curve"])
            entry["spent"].append(c["methods"][m]["spent"])
    summary = {p: {m: {"at": [stats(list(col)) for col in np.array(e["regret"]).T],
                       "curve": np.nanmean(np.array(e["curve"]), 0).tolist(), "spent": min(e["spent"])}
                   for m, e in by_method.items()} for p, by_method in problems.items()}
    mean_ranks = {f: {m: np.mean(r, 0).tolist() for m, r in by_method.items()} for f, by_method in ranks.items()}
    return {"problems": summary, "ranks": mean_ranks}


def targets(summary: dict[str, Any], families: dict[str, str]) -> list[dict[str, Any]]:
    """The issue's targets, per problem, number of workers and Cerebro searcher: against the
    best peer with as many trials in flight (the lowest mean regret) at 50 and 100 % (no worse,
    within one standard error of the difference), and against Cerebro's ASHA at 25 % (better;
    "n/a" for ASHA itself). ``best`` marks Cerebro's best searcher there: the best mean rank
    at 100 % in the family."""
    out = []
    for problem, by_method in summary["problems"].items():
        ranks = summary["ranks"][families[problem]]
        for workers in WORKERS:
            ours = [m for m in by_method if m.startswith("cerebro_") and m.endswith(f"@{workers}w")]
            best = min(ours, key=lambda m: (ranks[m][-1], by_method[m]["at"][-1]["mean"]))
            peers = [m for m in by_method if not m.startswith("cerebro_") and (m.endswith("@4w") == (workers > 1))]
            asha = f"cerebro_asha@{workers}w"
            for method in ours:
                for i, fraction in enumerate(FRACTIONS):
                    a, rivals = by_method[method]["at"][i], []
                    if fraction in (0.5, 1.0) and peers:
                        rivals.append((min(peers, key=lambda m: by_method[m]["at"][i]["mean"]), True))
                    if fraction == 0.25:
                        rivals.append((asha, False))
                    for rival, within in rivals:
                        target = _target(problem, fraction, method, rival, a, by_method[rival]["at"][i], within)
                        out.append({**target, "workers": workers, "best": method == best,
                                    "met": None if method == rival else target["met"]})
    return out


def _target(problem: str, fraction: float, ours: str, rival: str, a: dict[str, float], b: dict[str, float],
            within: bool) -> dict[str, Any]:
    """One target: ``ours`` no worse than ``rival`` within one standard error (``within``), or better."""
    slack, difference = math.hypot(a["se"], b["se"]), a["mean"] - b["mean"]
    return {"problem": problem, "fraction": fraction, "cerebro": ours, "against": rival, "difference": difference,
            "se": slack, "met": difference <= slack if within else difference < 0}


def markdown(summary: dict[str, Any], families: dict[str, str], budgets: dict[str, int], seeds: int) -> str:
    """One table per problem: mean ± s.e. (median) of the regret at each fraction, mean rank."""
    lines = []
    for problem, by_method in summary["problems"].items():
        ranks = summary["ranks"][families[problem]]
        lines += [f"**{problem}** ({families[problem]}; budget {budgets[problem]} trial-epochs, {seeds} seeds; "
                  f"simple regret, mean ± s.e. (median); rank: mean rank in the family at 50 / 100 %)", "",
                  "| method | " + " | ".join(f"{round(f * 100)} %" for f in FRACTIONS) + " | rank 50 / 100 % |",
                  "|---" * (len(FRACTIONS) + 2) + "|"]
        order = sorted(by_method, key=lambda m: by_method[m]["at"][-1]["mean"])
        for m in order:
            cells = [f"{a['mean']:.4g} ± {a['se']:.2g} ({a['median']:.3g})" for a in by_method[m]["at"]]
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {ranks[m][2]:.1f} / {ranks[m][3]:.1f} |")
        lines.append("")
    return "\n".join(lines)


def figure(summary: dict[str, Any], path: str) -> str:
    """The mean anytime curves, one panel per problem: a PNG with matplotlib, else plotly's HTML."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _plotly_figure(summary, os.path.splitext(path)[0] + ".html")
    problems = list(summary["problems"])
    methods = sorted({m for by_method in summary["problems"].values() for m in by_method if not m.endswith("@4w")})
    colours = dict(zip(methods, plt.get_cmap("tab20").colors))
    rows = math.ceil(len(problems) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.6 * rows), squeeze=False)
    for ax, problem in zip(axes.flat, problems):
        for m in methods:
            curve = summary["problems"][problem].get(m, {}).get("curve")
            if curve is not None:
                ax.plot(GRID * 100, np.maximum(curve, 1e-6), "-" if m.startswith("cerebro_") else "--",
                        color=colours[m], label=m, lw=1.3)
        ax.set(title=problem, xlabel="% of the budget (trial-epochs)", ylabel="mean simple regret", yscale="log")
    for ax in axes.flat[len(problems):]:
        ax.axis("off")
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _plotly_figure(summary: dict[str, Any], path: str) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    problems = list(summary["problems"])
    fig = make_subplots(rows=1, cols=len(problems), subplot_titles=problems)
    for col, problem in enumerate(problems, 1):
        for m, entry in sorted(summary["problems"][problem].items()):
            fig.add_trace(go.Scatter(x=GRID * 100, y=entry["curve"], name=m, legendgroup=m, showlegend=col == 1),
                          row=1, col=col)
    fig.update_yaxes(type="log")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.write_html(path, include_plotlyjs=True)
    return path


def chosen_peers(asked: list[str] | None, quick: bool) -> tuple[tuple[str, ...], dict[str, str]]:
    """The peers to run (all by default; none with ``--quick``) and why the others are skipped."""
    names = asked if asked is not None else ([] if quick else list(_peers.PEERS))
    unknown = sorted(set(names) - set(_peers.PEERS))
    if unknown:
        raise SystemExit(f"--peers {unknown}: not a peer here; the peers are {sorted(_peers.PEERS)}")
    skipped = {}
    for name in names:
        reason = _peers.missing(name)
        if reason:
            skipped[name] = reason
    return tuple(n for n in names if n not in skipped), skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="MF-Hartmann 3-D and one LCBench task, 2 seeds, "
                        "a budget of 8 x max_epochs, no peers unless --peers names some")
    parser.add_argument("--seeds", type=int, help="seeds 0 .. N-1 (default 10; 2 with --quick)")
    parser.add_argument("--budget", type=int, help="trial-epochs per run, in max_epochs (default 30; 8 with --quick)")
    parser.add_argument("--peers", nargs="*", help=f"which peers (default: all of {sorted(_peers.PEERS)})")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    parser.add_argument("--out", default="benchmarks/results/search_vs_peers.json")
    parser.add_argument("--figure", default="benchmarks/figures/search_vs_peers.png")
    args = parser.parse_args()
    seeds = args.seeds or (2 if args.quick else 10)
    multiple = args.budget or (8 if args.quick else 30)
    peers, skipped = chosen_peers(args.peers, args.quick)
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}")
    problems = mf.problems(quick=args.quick)
    families = {p.name: p.family for p in problems}
    budgets = {p.name: multiple * p.max_epochs for p in problems}
    jobs = [(p.name, seed, budgets[p.name], peers) for p in problems for seed in range(seeds)]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        cells = []
        for c in pool.imap(cell, jobs):
            cells.append(c)
            print(f"{c['problem']} seed {c['seed']}: " + ", ".join(
                f"{m} {v['regret'][-1]:.3g}" for m, v in sorted(c["methods"].items())), flush=True)
    wall = time.perf_counter() - started
    summary = summarize(cells, families)
    same = {k: all(c["same_decisions"][k] for c in cells) for k in cells[0]["same_decisions"]}
    goals = targets(summary, families)
    table = markdown(summary, families, budgets, seeds)
    print("\n" + table)
    for kind, ok in same.items():
        print(f"cerebro_{kind}: the same trials, configs, statuses and epochs on 1 and 4 workers "
              f"(max_concurrent={WORKERS[max(WORKERS)]}): {ok}")
    for g in goals:
        if not g["best"] and not g["cerebro"].startswith(("cerebro_bohb", "cerebro_tpe")):
            continue          # the model-based searchers' and the best one's are printed
        print(f"target {g['problem']} at {round(g['fraction'] * 100)} %: {g['cerebro']}{' (best)' * g['best']} - "
              f"{g['against']} = "
              f"{g['difference']:+.4g} (s.e. {g['se']:.2g}): "
              f"{'n/a (it is ASHA)' if g['met'] is None else 'met' if g['met'] else 'NOT met'}")
    path = figure(summary, args.figure)
    print(f"wall time {wall:.0f} s on {args.jobs} processes; figure {path}")
    write_json({**provenance(), "quick": args.quick, "seeds": seeds, "budgets": budgets, "peers": list(peers),
                "skipped": skipped, "fractions": FRACTIONS, "grid": GRID.tolist(), "wall_s": wall,
                "jobs": args.jobs, "families": families, "same_decisions": same, "targets": goals,
                "summary": summary, "cells": cells, "table": table, "figure": path}, args.out)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
