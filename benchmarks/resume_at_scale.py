"""A run of 10,000 trials killed at its 6,000th and resumed with ``cerebro resume`` (issue 60,
part 3): how long until the resumed run has trained its first sub-epoch, how long it takes to the end,
and whether it ends bitwise equal to the same run uninterrupted (every epoch's metrics and the
weights of every trial).

Random search, one epoch a trial of a 4-to-2 linear model with no work of its own, on 2 local
workers; the driver is killed with SIGKILL once 6,000 trials have ended, as a crash would.

    .venv/bin/python benchmarks/resume_at_scale.py                     # ~6 min on 2 cores
    .venv/bin/python benchmarks/resume_at_scale.py --trials 1000 --kill-at 600
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(store: str, trials: int) -> None:
    """The run itself, in this process (its build is pickled by value: this is __main__)."""
    import numpy as np
    import torch

    import cerebro as cb

    def build(config: dict) -> cb.TorchTrainable:
        model = torch.nn.Linear(4, 2)
        return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
                                 torch.nn.functional.cross_entropy, batch_size=64)

    rng = np.random.default_rng(0)
    data = cb.Dataset.from_numpy(rng.normal(size=(128, 4)).astype(np.float32), rng.integers(0, 2, 128),
                                 validation=None, partitions=2)
    cb.RandomSearch(build, {"lr": cb.loguniform(1e-4, 1e-1)}, num_trials=trials, epochs=1,
                    metric="train_loss").fit(data, workers=2, store=store, seed=0, verbose=0, tensorboard=False)


def count(store: str, event: str) -> int:
    try:
        with open(os.path.join(store, "journal.jsonl"), "rb") as f:
            return f.read().count(f'"event": "{event}"'.encode())
    except FileNotFoundError:
        return 0


def trained_after_resume(store: str) -> bool:
    """Whether the journal has a sub-epoch after its run_resumed line (the journal records
    sub-epochs as they end: this is the resumed run's first one done, an upper bound on
    when it started)."""
    with open(os.path.join(store, "journal.jsonl"), "rb") as f:
        journal = f.read()
    resumed = journal.rfind(b'"event": "run_resumed"')
    return resumed >= 0 and journal.find(b'"event": "sub_epoch"', resumed) >= 0


def killed_and_resumed(store: str, trials: int, kill_at: int) -> dict:
    child = subprocess.Popen([sys.executable, __file__, "--run", store, "--trials", str(trials)])
    while count(store, "trial_ended") < kill_at:
        if child.poll() is not None:
            raise RuntimeError(f"the run ended (code {child.returncode}) before {kill_at} trials ended")
        time.sleep(0.02)      # polling the journal a real run writes
    child.send_signal(signal.SIGKILL)
    child.wait()
    ended = count(store, "trial_ended")
    started = time.perf_counter()
    resumed = subprocess.Popen([sys.executable, "-m", "cerebro", "resume", store, "--quiet"],
                               stdout=subprocess.DEVNULL)
    while not trained_after_resume(store):
        if resumed.poll() is not None:
            raise RuntimeError(f"cerebro resume ended (code {resumed.returncode}) before training")
        time.sleep(0.01)
    first = time.perf_counter() - started
    if resumed.wait() != 0:
        raise RuntimeError(f"cerebro resume failed with code {resumed.returncode}")
    return {"ended_when_killed": ended, "next_trial_s": first, "resume_total_s": time.perf_counter() - started}


def same_results(one: str, other: str) -> bool:
    """Every epoch's metrics, and every trial's weights, bitwise."""
    import torch

    import cerebro as cb
    a, b = cb.load(one), cb.load(other)
    columns = ["trial_id", "epoch", "train_loss"]
    if not a.history()[columns].equals(b.history()[columns]):
        return False
    return all(all(torch.equal(x, y) for x, y in zip(s.state_dict().values(), t.state_dict().values()))
               for s, t in zip(a.trials, b.trials))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--kill-at", type=int, default=6000)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.run:
        run(arguments.run, arguments.trials)
        return
    with tempfile.TemporaryDirectory() as directory:
        whole, crashed = os.path.join(directory, "whole"), os.path.join(directory, "crashed")
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--run", whole, "--trials", str(arguments.trials)], check=True)
        row = {"trials": arguments.trials, "uninterrupted_s": time.perf_counter() - started,
               **killed_and_resumed(crashed, arguments.trials, arguments.kill_at)}
        row["bitwise_equal"] = same_results(whole, crashed)
    print("| trials | killed after (trials ended) | uninterrupted run s | resume: first sub-epoch done s | "
          "resume to the end s | bitwise equal |\n|---|---|---|---|---|---|")
    print(f"| {row['trials']:,} | {row['ended_when_killed']:,} | {row['uninterrupted_s']:.1f} | "
          f"{row['next_trial_s']:.1f} | {row['resume_total_s']:.1f} | {row['bitwise_equal']} |")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "resume_at_scale.json"), "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
