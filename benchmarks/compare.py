"""MOP against the other ways to train many configurations, side by side on one workload.

Strategies (each on the same 2 workers, the same grid, the same epochs and hyperparameters):

- ``mop``: Cerebro, local backend, the data partitioned over the workers.
- ``sequential``: one configuration after another in one process, full data, all cores.
- ``data_parallel``: PyTorch DistributedDataParallel over gloo, one process per worker,
  gradients all-reduced every mini-batch; configurations one after another.
- ``model_averaging``: each worker trains on its own partition for an epoch, then the
  weights are averaged (bulk synchronous); configurations one after another.
- ``task_parallel``: Ray Tune, one trial per worker, each trial holding the whole dataset.

For each: wall time, time per epoch (of all configurations), bytes communicated (measured
where they are sent), copies of the training data, the validation accuracy of every
configuration after every epoch, and the best final accuracy. Writes JSON and a Markdown
table.

Usage::

    .venv/bin/python benchmarks/compare.py [--quick] [--out benchmarks/results/compare.json]
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import itertools
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import cerebro as cb

WORKERS = 2


def workload(quick: bool) -> dict[str, Any]:
    rows = 4096 if quick else 65536
    rng = np.random.default_rng(0)
    features = rng.normal(size=(rows, 64)).astype(np.float32)
    weights = rng.normal(size=(64, 10)).astype(np.float32)
    # |x| on half the features: a boundary that takes several epochs to learn, so the
    # learning curves can tell strategies apart (a linear one is learnt in the first epoch).
    signal = np.abs(features[:, :32]) @ weights[:32] + features[:, 32:] @ weights[32:]
    label = (signal + 0.5 * rng.normal(size=(rows, 10))).argmax(1)
    grid = ({"hidden": [64, 256], "lr": [3e-3], "batch_size": [64]} if quick else
            {"hidden": [64, 256], "lr": [1e-3, 3e-3], "batch_size": [32, 64]})
    configs = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    return {"features": features, "label": label, "grid": grid, "configs": configs, "epochs": 2 if quick else 5}


def make_model(config: dict) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                               torch.nn.Linear(config["hidden"], 10))


def build(config: dict) -> cb.TorchTrainable:
    model = make_model(config)
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=config["batch_size"],
                             metrics={"accuracy": cb.metrics.accuracy})


def split(work: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same seeded 80/20 split every strategy uses (the one cb.Dataset makes)."""
    data = cb.Dataset.from_numpy(work["features"], work["label"], validation=0.2, seed=0)
    (x, y), (vx, vy) = data.train_arrays(), data.validation_arrays()
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(vx), torch.from_numpy(vy)


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


# --- strategies -----------------------------------------------------------------------------
def run_mop(work: dict) -> dict[str, Any]:
    data = cb.Dataset.from_numpy(work["features"], work["label"], validation=0.2, partitions=WORKERS, seed=0)
    space = {k: cb.choice(values) for k, values in work["grid"].items()}
    search = cb.GridSearch(build, space, epochs=work["epochs"], metric="val_accuracy", mode="max")
    with tempfile.TemporaryDirectory() as store:
        started = time.perf_counter()
        result = search.fit(data, backend=cb.LocalBackend(WORKERS), store=os.path.join(store, "run"), seed=0,
                            verbose=0)
        wall = time.perf_counter() - started
        history, schedule = result.history(), result.schedule()
    curves = {json.dumps(t.config): history[history.trial_id == t.trial_id]
              .sort_values("epoch").val_accuracy.tolist() for t in result.trials}
    return {"wall_s": wall, "training_s": float(schedule.end.max() - schedule.start.min()),
            "comm_bytes": result.bytes_communicated, "data_copies": 1,
            "data_per_worker": f"1/{WORKERS} of the rows", "curves": curves}


def run_sequential(work: dict) -> dict[str, Any]:
    torch.set_num_threads(WORKERS)
    x, y, vx, vy = split(work)
    curves = {}
    started = time.perf_counter()
    for config in work["configs"]:
        torch.manual_seed(0)
        trainable = build(config)
        curve = []
        for _ in range(work["epochs"]):
            trainable.model.train()
            for rows in torch.randperm(len(x)).split(config["batch_size"]):
                trainable.optimizer.zero_grad()
                trainable.loss(trainable.model(x[rows]), y[rows]).backward()
                trainable.optimizer.step()
            curve.append(accuracy(trainable.model, vx, vy))
        curves[json.dumps(config)] = curve
    wall = time.perf_counter() - started
    return {"wall_s": wall, "training_s": wall, "comm_bytes": 0, "data_copies": 1,
            "data_per_worker": "all rows, one process", "curves": curves}


def _distributed(rank: int, strategy: str, work: dict, rendezvous: str, out: str) -> None:
    """One of WORKERS processes of ``data_parallel`` or ``model_averaging``. They meet through
    a file, not a port picked beforehand: another process could take such a port between
    its pick and gloo's bind. Gloo's own connections stay on loopback."""
    faulthandler.enable()       # an abort in gloo's C++ shows where Python was
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORKERS)
    torch.set_num_threads(1)
    x, y, vx, vy = split(work)
    mine = torch.arange(rank, len(x), WORKERS)          # this worker's rows
    x, y = x[mine], y[mine]
    dist.barrier()
    started = time.perf_counter()                       # training starts: start-up is over
    sent = 0
    curves = {}
    for config in work["configs"]:
        torch.manual_seed(0)
        model = make_model(config)
        if strategy == "data_parallel":
            model = torch.nn.parallel.DistributedDataParallel(model)

            def counting_hook(state, bucket):   # no annotations: DDP checks them as real types
                nonlocal sent
                sent += bucket.buffer().numel() * bucket.buffer().element_size()
                return default_hooks.allreduce_hook(None, bucket)
            model.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
        batch = config["batch_size"] // WORKERS if strategy == "data_parallel" else config["batch_size"]
        curve = []
        for epoch in range(work["epochs"]):
            model.train()
            generator = torch.Generator().manual_seed(epoch)
            for rows in torch.randperm(len(x), generator=generator).split(batch):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
                optimizer.step()
            if strategy == "model_averaging":
                with torch.no_grad():
                    for parameter in model.parameters():
                        dist.all_reduce(parameter)
                        parameter /= WORKERS
                        sent += parameter.numel() * parameter.element_size()
            curve.append(accuracy(model, vx, vy))
        curves[json.dumps(config)] = curve
        # DDP's reducer holds the process group: let go of it now, so the group ends in
        # destroy_process_group below, while every rank is there, and not when this
        # function returns, after the other rank may have closed its connections
        # (gloo then aborted the process: "terminate called without an active exception").
        del model, optimizer
        gc.collect()
    training = time.perf_counter() - started
    totals = torch.tensor([sent], dtype=torch.float64)
    dist.all_reduce(totals)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"comm_bytes": int(totals.item()), "training_s": training, "curves": curves}, f)
    dist.barrier()      # no rank tears gloo down while another still uses it
    dist.destroy_process_group()


def run_distributed(strategy: str, work: dict) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "out.json")
        started = time.perf_counter()
        mp.spawn(_distributed, args=(strategy, work, os.path.join(scratch, "rendezvous"), out), nprocs=WORKERS,
                 join=True)
        wall = time.perf_counter() - started
        with open(out) as f:
            measured = json.load(f)
    per_worker = "1/2 of the rows" if strategy == "model_averaging" else "1/2 of the rows per mini-batch"
    return {"wall_s": wall, "data_copies": 1, "data_per_worker": per_worker, **measured}


def _ray_trial(space: dict, configs: list[dict], data: tuple[np.ndarray, ...], epochs: int) -> None:
    """One Ray Tune trial: it holds the whole training set, as task parallelism does."""
    from ray import tune
    config = configs[space["index"]]
    torch.set_num_threads(1)
    x, y, vx, vy = (torch.from_numpy(np.array(a)) for a in data)
    received = sum(a.nbytes for a in data)            # what this trial was shipped
    started_at = time.time()
    torch.manual_seed(0)
    trainable = build(config)
    for epoch in range(epochs):
        trainable.model.train()
        loop_started = time.perf_counter()
        for rows in torch.randperm(len(x)).split(config["batch_size"]):
            trainable.optimizer.zero_grad()
            trainable.loss(trainable.model(x[rows]), y[rows]).backward()
            trainable.optimizer.step()
        tune.report({"epoch": epoch + 1, "val_accuracy": accuracy(trainable.model, vx, vy),
                     "loop_s": time.perf_counter() - loop_started, "pid": os.getpid(),
                     "data_bytes": received, "started_at": started_at, "now": time.time()})


def run_task_parallel(work: dict) -> dict[str, Any]:
    import ray
    from ray import tune
    x, y, vx, vy = (a.numpy() for a in split(work))
    started = time.perf_counter()
    # A Ray instance of its own: never a cluster another process left running on this machine.
    ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        with tempfile.TemporaryDirectory() as storage:
            trial = tune.with_resources(tune.with_parameters(_ray_trial, configs=work["configs"], data=(x, y, vx, vy),
                                                             epochs=work["epochs"]), {"cpu": 1})
            space = {"index": tune.grid_search(list(range(len(work["configs"]))))}
            tuner = tune.Tuner(trial, param_space=space,
                               tune_config=tune.TuneConfig(max_concurrent_trials=WORKERS),
                               run_config=tune.RunConfig(storage_path=storage, verbose=0))
            results = tuner.fit()
            wall = time.perf_counter() - started
            curves, shipped, first, last, loops, pids = {}, 0, math.inf, 0.0, 0.0, set()
            for result in results:
                frame = result.metrics_dataframe.sort_values("epoch")
                curves[json.dumps(work["configs"][result.config["index"]])] = frame.val_accuracy.tolist()
                shipped += int(frame.data_bytes.iloc[-1])
                first, last = min(first, frame.started_at.min()), max(last, frame.now.max())
                loops += float(frame.loop_s.sum())
                pids.update(frame.pid)
    finally:
        ray.shutdown()
    # Where Ray's time goes: the trials' own SGD loops against the span they were spread over.
    return {"wall_s": wall, "training_s": last - first, "comm_bytes": shipped, "data_copies": WORKERS,
            "data_per_worker": "all rows (one copy per worker on a cluster)", "curves": curves,
            "sgd_loop_s_per_worker": loops / WORKERS, "trial_processes": len(pids)}


STRATEGIES = {
    "task_parallel": run_task_parallel,
    "mop": run_mop,
    "sequential": run_sequential,
    "data_parallel": lambda work: run_distributed("data_parallel", work),
    "model_averaging": lambda work: run_distributed("model_averaging", work),
}


def run_measured(name: str, quick: bool, scratch: str) -> dict[str, Any]:
    """Run one strategy in a process of its own; sum the peak memory of its process tree."""
    import psutil
    part = os.path.join(scratch, f"{name}.json")
    process = psutil.Popen([sys.executable, os.path.abspath(__file__), "--strategy", name, "--out", part,
                            *(["--quick"] if quick else [])])
    peaks: dict[int, int] = {}
    while process.poll() is None:
        for member in [process, *process.children(recursive=True)]:
            try:
                peaks[member.pid] = max(peaks.get(member.pid, 0), member.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.1)   # a sampling interval, not a synchronisation
    if process.returncode != 0:
        raise RuntimeError(f"strategy {name} failed with exit code {process.returncode}")
    with open(part) as f:
        entry = json.load(f)
    return {**entry, "peak_rss_mb": sum(peaks.values()) / 2**20, "processes": len(peaks)}


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and by how much it is met or missed."""
    by = {r["strategy"]: r for r in results}
    mop, seq, ddp, ray, avg = (by[name] for name in ("mop", "sequential", "data_parallel", "task_parallel",
                                                     "model_averaging"))

    def best_curve(entry: dict) -> list[float]:
        return max(entry["curves"].values(), key=lambda curve: curve[-1])
    lag = float(np.mean(np.array(best_curve(seq)) - np.array(best_curve(avg))))
    wall_ratio = mop["wall_s"] / ray["wall_s"]
    rows = [("MOP wall time / Ray Tune's", wall_ratio, "<= 1.05", wall_ratio <= 1.05),
            ("DDP bytes / MOP bytes", ddp["comm_bytes"] / mop["comm_bytes"], ">= 100",
             ddp["comm_bytes"] >= 100 * mop["comm_bytes"]),
            ("sequential s per epoch / MOP's", seq["epoch_s"] / mop["epoch_s"], "> 1", seq["epoch_s"] > mop["epoch_s"]),
            ("DDP s per epoch / MOP's", ddp["epoch_s"] / mop["epoch_s"], "> 1", ddp["epoch_s"] > mop["epoch_s"]),
            ("sequential best val acc - MOP's (points)", 100 * (seq["best_val_accuracy"] - mop["best_val_accuracy"]),
             "<= 1", seq["best_val_accuracy"] - mop["best_val_accuracy"] <= 0.01),
            ("model averaging behind sequential, mean over epochs of the best curves (points)", 100 * lag, "> 0",
             lag > 0)]
    return [{"target": name, "measured": round(value, 3), "rule": rule, "met": bool(met)}
            for name, value, rule, met in rows]


def figures(results: list[dict[str, Any]], directory: str) -> list[str]:
    """Learning curves of each strategy's best configuration, and bars of time, memory, bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(directory, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        best = max(r["curves"], key=lambda config: r["curves"][config][-1])
        curve = r["curves"][best]
        ax.plot(range(1, len(curve) + 1), curve, marker="o", label=f"{r['strategy']} {json.loads(best)}")
    ax.set(xlabel="epoch", ylabel="validation accuracy", title="best configuration of each strategy")
    ax.legend(fontsize=6)
    curves_png = os.path.join(directory, "compare_curves.png")
    fig.tight_layout()
    fig.savefig(curves_png, dpi=120)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    names = [r["strategy"] for r in results]
    for ax, key, label, log in ((axes[0], "epoch_s", "s per epoch (all configurations)", False),
                                (axes[1], "peak_rss_mb", "peak memory, MB (all processes)", False),
                                (axes[2], "comm_bytes", "bytes communicated", True)):
        ax.bar(names, [max(r[key], 1) if log else r[key] for r in results])
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        if log:
            ax.set_yscale("log")
    bars_png = os.path.join(directory, "compare_bars.png")
    fig.tight_layout()
    fig.savefig(bars_png, dpi=120)
    return [curves_png, bars_png]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 configurations, 2 epochs, 4096 rows")
    parser.add_argument("--out", default="benchmarks/results/compare.json")
    parser.add_argument("--figures", default="benchmarks/figures", help="where the PNG figures go")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), help=argparse.SUPPRESS)   # one, in-process
    args = parser.parse_args()
    work = workload(args.quick)
    if args.strategy:
        entry = {"strategy": args.strategy, **STRATEGIES[args.strategy](work)}
        entry["epoch_s"] = entry["training_s"] / work["epochs"]   # all configurations, after start-up
        entry["startup_s"] = entry["wall_s"] - entry["training_s"]
        entry["best_val_accuracy"] = max(curve[-1] for curve in entry["curves"].values())
        with open(args.out, "w") as f:
            json.dump(entry, f)
        return
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in STRATEGIES:
            entry = run_measured(name, args.quick, scratch)
            results.append(entry)
            print(f"{name:16} wall {entry['wall_s']:7.1f} s   start-up {entry['startup_s']:5.1f} s   "
                  f"epoch {entry['epoch_s']:6.2f} s   "
                  f"peak {entry['peak_rss_mb']:7.0f} MB   comm {entry['comm_bytes'] / 1e6:10.2f} MB   "
                  f"best val acc {entry['best_val_accuracy']:.4f}", flush=True)
    table = ["| strategy | wall s | start-up s | s per epoch after start-up | peak memory MB | data copies "
             "| data per worker | comm MB | best val acc |", "|---|---|---|---|---|---|---|---|---|"]
    table += [f"| {r['strategy']} | {r['wall_s']:.1f} | {r['startup_s']:.1f} | {r['epoch_s']:.2f} | "
              f"{r['peak_rss_mb']:.0f} | "
              f"{r['data_copies']} | {r['data_per_worker']} | {r['comm_bytes'] / 1e6:.2f} | "
              f"{r['best_val_accuracy']:.4f} |" for r in results]
    goals = targets(results)
    table += ["", "| target | measured | rule | met |", "|---|---|---|---|"]
    table += [f"| {g['target']} | {g['measured']} | {g['rule']} | {'yes' if g['met'] else '**no**'} |" for g in goals]
    print("\n".join(table))
    pngs = figures(results, args.figures)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join([sys.executable, *sys.argv]), "quick": args.quick,
                   "machine": {"cpu_count": os.cpu_count(), "torch": torch.__version__},
                   "workload": {"rows": len(work["label"]), "configs": work["configs"], "epochs": work["epochs"],
                                "workers": WORKERS}, "results": results, "targets": goals, "table": "\n".join(table),
                   "figures": pngs}, f, indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write("\n".join(table) + "\n")
    print(f"wrote {args.out}, its table as .md, and {', '.join(pngs)}")


if __name__ == "__main__":
    main()
