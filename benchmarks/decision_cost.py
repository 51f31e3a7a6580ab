"""What a searcher's decision costs as its trials grow (issue 60, part 4): ASHA and TPE (pruned
by ASHA's rule) at 1,000, 3,000 and 10,000 trials, run by ``cb.simulate`` on 4 simulated
workers. Every call the engine makes to the searcher (``suggest``, ``report``, ``decide``,
``trial_ended``, ``state``) is timed; the table gives the microseconds a decision (a
``report`` or a ``decide``) costs with all of them, over the whole run and over its last
tenth of trials, where the rungs are fullest.

A decision costs O(log n) comparisons for ASHA's rungs (two sorted lists a rung), plus the
searcher's state once every n/64 decisions (O(n) each: O(64) amortized). TPE also proposes
each trial with Optuna's TPE sampler, whose cost grows with the trials it fits on: O(n) a
proposal (one a trial, not one a decision), shown apart.

    .venv/bin/python benchmarks/decision_cost.py                    # ~3 min on 2 cores
    .venv/bin/python benchmarks/decision_cost.py --trials 1000 3000
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable

import cerebro as cb

HERE = os.path.dirname(os.path.abspath(__file__))
SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([32, 64, 128, 256]), "dropout": cb.uniform(0, 0.5)}
CALLS = ("suggest", "report", "decide", "trial_ended", "state")


def no_model(config: dict) -> None:
    """Never called by cb.simulate."""


def objective(config: dict, epoch: int) -> dict[str, float]:
    return {"val_loss": abs(math.log10(config["lr"] / 3e-3)) + config["dropout"] / 4
            + 8 / (epoch * math.sqrt(config["width"]))}


SEARCHERS: dict[str, Callable[[int], cb.Searcher]] = {
    "ASHA": lambda n: cb.ASHA(no_model, SPACE, num_trials=n, max_epochs=27, grace_period=1, max_concurrent=64),
    "TPE, pruned": lambda n: cb.TPESearch(no_model, SPACE, num_trials=n, epochs=27, grace_period=1, max_concurrent=64),
}


def timed(searcher: cb.Searcher) -> list[tuple[str, float, int]]:
    """Wrap each engine call of ``searcher`` to log (call, seconds, trials created so far)."""
    log: list[tuple[str, float, int]] = []
    created = [0]
    for name in CALLS:
        method = getattr(searcher, name)

        def wrapper(*args, _name=name, _method=method):
            started = time.perf_counter()
            answer = _method(*args)
            log.append((_name, time.perf_counter() - started, created[0]))
            if _name == "suggest":
                created[0] += len(answer)
            return answer
        setattr(searcher, name, wrapper)
    return log


def measure(name: str, trials: int) -> dict:
    searcher = SEARCHERS[name](trials)
    log = timed(searcher)
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        cb.simulate(searcher, objective, workers=4, seed=0, store=os.path.join(directory, "run"))
        wall = time.perf_counter() - started
    row: dict = {"searcher": name, "trials": trials, "wall_s": wall}
    for part, since in (("all", 0), ("last_tenth", trials * 9 // 10)):
        seconds: dict[str, float] = defaultdict(float)
        decisions = 0
        for call, spent, created in log:
            if created >= since:
                seconds[call] += spent
                decisions += call in ("report", "decide")
        row[part] = {"decisions": decisions,
                     "us_per_decision": 1e6 * sum(v for k, v in seconds.items() if k != "suggest") / decisions,
                     "us_per_proposal": 1e6 * seconds["suggest"] / max(1, trials - since)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--tpe-up-to", type=int, default=3000,
                        help="TPE at this many trials at most: Optuna's sampler makes 10,000 a quarter of an hour")
    arguments = parser.parse_args()
    rows = []
    print("| searcher | trials | decisions | µs a decision (all) | µs a decision (last tenth) | "
          "µs a proposal (all) | µs a proposal (last tenth) | simulated run s |\n|---|---|---|---|---|---|---|---|")
    for name in SEARCHERS:
        for trials in arguments.trials:
            if name.startswith("TPE") and trials > arguments.tpe_up_to:
                continue
            row = measure(name, trials)
            rows.append(row)
            print(f"| {name} | {trials:,} | {row['all']['decisions']:,} | {row['all']['us_per_decision']:.0f} | "
                  f"{row['last_tenth']['us_per_decision']:.0f} | {row['all']['us_per_proposal']:.0f} | "
                  f"{row['last_tenth']['us_per_proposal']:.0f} | {row['wall_s']:.1f} |", flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "decision_cost.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
