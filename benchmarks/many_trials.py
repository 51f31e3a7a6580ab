"""Many cheap trials, side by side with Ray Tune: the bookkeeping each system adds per trial.

Each trial trains one epoch whose work is ``--work-ms`` of wall (a sleep inside the model's
forward pass: the same fixed work for both systems, whatever the machine), random search, 2
workers (Cerebro: 2 local worker processes over 2 partitions, each sub-epoch half the work;
Ray Tune 2.60: ``ray.init(num_cpus=2)``, one CPU per trial, its default storage and
checkpointing; with ``reuse_actors=True``, its setting for many short trials, and with its
default, a fresh actor a trial, up to ``--ray-default-up-to`` trials: ~1 s a trial here).
Each run is a process of its own, which reports its wall time and its peak RSS above an idle
Python with the system imported. Then Cerebro's run directory is read by every view:
``cb.load``, ``ranked()``, ``history()``, ``cerebro status`` and ``cerebro report``.

    .venv/bin/python benchmarks/many_trials.py                          # 100, 1,000 and 10,000 trials (~50 min)
    .venv/bin/python benchmarks/many_trials.py --trials 100 1000 --no-ray
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 2


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_cerebro(trials: int, work: float, store: str) -> dict:
    """In this process: the run, its wall and the driver's peak RSS above the idle import."""
    import numpy as np
    import torch

    import cerebro as cb
    idle = peak_rss_mb()

    class Work(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training:
                time.sleep(work / WORKERS)          # one batch per partition: the epoch's work over 2
            return super().forward(x)

    def build(config: dict) -> cb.TorchTrainable:
        model = Work(4, 2)
        return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
                                 torch.nn.functional.cross_entropy, batch_size=64)

    rng = np.random.default_rng(0)
    data = cb.Dataset.from_numpy(rng.normal(size=(128, 4)).astype(np.float32), rng.integers(0, 2, 128),
                                 validation=None, partitions=WORKERS)
    search = cb.RandomSearch(build, {"lr": cb.loguniform(1e-4, 1e-1)}, num_trials=trials, epochs=1,
                             metric="train_loss")
    started = time.perf_counter()
    search.fit(data, workers=WORKERS, store=store, seed=0, verbose=0, tensorboard=False)
    return {"wall": time.perf_counter() - started, "rss_mb": peak_rss_mb() - idle}


def run_ray(trials: int, work: float, store: str, reuse_actors: bool = False) -> dict:
    """In this process: the same trials under Ray Tune (``reuse_actors``: its setting for
    many short trials, off by default, which starts a fresh actor a trial)."""
    import ray
    from ray import tune
    idle = peak_rss_mb()

    def trainable(config: dict) -> None:
        time.sleep(work)
        tune.report({"loss": config["lr"]})

    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    tune.Tuner(trainable, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
               tune_config=tune.TuneConfig(num_samples=trials, metric="loss", mode="min",
                                           reuse_actors=reuse_actors),
               run_config=tune.RunConfig(storage_path=store, verbose=0)).fit()
    wall = time.perf_counter() - started
    ray.shutdown()
    return {"wall": wall, "rss_mb": peak_rss_mb() - idle}


def views(store: str) -> dict:
    """Seconds each view of Cerebro's run takes, and what it shows."""
    import cerebro as cb
    timed: dict = {}
    started = time.perf_counter()
    result = cb.load(store)
    timed["load"] = time.perf_counter() - started
    for name, view in (("ranked", result.ranked), ("history", result.history)):
        started = time.perf_counter()
        view()
        timed[name] = time.perf_counter() - started
    for command in (["status", store], ["report", store]):
        started = time.perf_counter()
        shown = subprocess.run([sys.executable, "-m", "cerebro", *command], capture_output=True, text=True,
                               check=True)
        timed[command[0]] = time.perf_counter() - started
        if command[0] == "status":
            timed["status_lines"] = len(shown.stdout.splitlines())
    report = os.path.join(store, "report.html")
    timed["report_mb"] = os.path.getsize(report) / 1e6 if os.path.exists(report) else None
    journal = os.path.join(store, "journal.jsonl")
    timed["journal_bytes_per_trial"] = os.path.getsize(journal) / len(result.trials)
    timed["files"] = sum(len(names) for _, _, names in os.walk(store))
    return timed


def child(system: str, trials: int, work: float) -> dict:
    """One run in a fresh interpreter (its own peak RSS), as JSON on its last line."""
    code = (f"import sys, json; sys.path.insert(0, {HERE!r}); import many_trials as m; "
            f"print(json.dumps(m.measured({system!r}, {trials}, {work})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{system} with {trials} trials failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measured(system: str, trials: int, work: float) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        store = os.path.join(directory, "run")
        if system.startswith("ray"):
            return run_ray(trials, work, directory, reuse_actors=system == "ray reusing actors")
        outcome = run_cerebro(trials, work, store)
        outcome["views"] = views(store)
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--work-ms", type=float, default=100.0)
    parser.add_argument("--no-ray", action="store_true", help="Cerebro alone")
    parser.add_argument("--ray-default-up-to", type=int, default=100,
                        help="run Ray Tune with its defaults (a fresh actor a trial, ~1 s each here) up to this "
                             "many trials; with reuse_actors=True at every size")
    arguments = parser.parse_args()
    work, rows = arguments.work_ms / 1000, []
    print("| trials | system | wall s | minimum s | overhead ms / trial | driver peak RSS MB | vs Ray Tune reusing "
          "actors |")
    print("|---|---|---|---|---|---|---|")
    for trials in arguments.trials:
        minimum = trials * work / WORKERS
        systems = ["cerebro"]
        if not arguments.no_ray:
            systems += ["ray reusing actors", *(["ray"] if trials <= arguments.ray_default_up_to else [])]
        outcomes = {system: child(system, trials, work) for system in systems}
        for system, outcome in outcomes.items():
            overhead = (outcome["wall"] - minimum) / trials * 1000
            ratio = (outcome["wall"] / outcomes["ray reusing actors"]["wall"] if "ray reusing actors" in outcomes
                     else None)
            print(f"| {trials:,} | {system} | {outcome['wall']:.1f} | {minimum:.1f} | {overhead:.1f} | "
                  f"{outcome['rss_mb']:.0f} | {'' if ratio is None else f'{ratio:.2f}x'} |")
            rows.append({"trials": trials, "system": system, "minimum": minimum, **outcome})
        print(f"  views of Cerebro's run: {json.dumps(outcomes['cerebro']['views'])}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "many_trials.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
