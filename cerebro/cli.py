"""``cerebro`` on the command line: demo, run, status, resume, report, export."""
from __future__ import annotations

import json
import math
import runpy
import sys

import click
from rich import box
from rich.console import Console
from rich.table import Table

from .report import Result, load


def print_summary(result: Result, console: Console) -> None:
    """The trials ranked by the run's metric, as a table."""
    summary = result.summary()
    table = Table(title=f"trials ranked by {result.metric} ({result.mode})", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for column in summary.columns:
        table.add_column(str(column), justify="left" if column in ("trial_id", "status") else "right")
    for row in summary.itertuples(index=False):
        table.add_row(*(f"{v:.4f}" if isinstance(v, float) and not math.isnan(v) and not v.is_integer()
                        else str(v) for v in row))
    console.print(table)


@click.group()
def main() -> None:
    """Cerebro: deep-learning model selection with Model Hopper Parallelism."""


@main.command()
@click.option("--workers", default=2, show_default=True, help="local worker processes")
@click.option("--epochs", default=10, show_default=True, help="epochs per trial")
@click.option("--store", default=None, help="run directory (default: ./cerebro_runs/demo-<time>)")
@click.option("--seed", default=0, show_default=True)
def demo(workers: int, epochs: int, store: str | None, seed: int) -> None:
    """Select among 8 MLP/CNN configurations on the bundled 8x8 digits."""
    from . import demo as demo_module
    result = demo_module.search(epochs).fit(demo_module.load_data(), workers=workers, store=store, seed=seed)
    console = Console()
    print_summary(result, console)
    best = result.best
    console.print(f"best: {best.trial_id} {best.config} {result.metric}={best.metrics[result.metric]:.4f}")


@main.command()
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1)
def run(script: str, args: tuple[str, ...]) -> None:
    """Run an experiment script (one that calls a searcher's fit) as __main__."""
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def status(run_dir: str) -> None:
    """Show where a run stands: its trials, their status and metrics."""
    result = load(run_dir)
    console = Console()
    done = sum(t.status != "running" for t in result.trials)
    console.print(f"{'finished' if result.finished else 'not finished'}: {done} of "
                  f"{len(result.trials)} trials ended")
    print_summary(result, console)


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--workers", default=None, type=int, help="local worker processes (default: as the run had)")
@click.option("--quiet", is_flag=True, help="no live progress")
def resume(run_dir: str, workers: int | None, quiet: bool) -> None:
    """Finish a run whose driver died (killed, crashed, Ctrl-C), from its journal and
    checkpoints; the results are those the run would have had without the crash.

    Example: cerebro resume cerebro_runs/gridsearch-20261122-101500-ab12
    """
    from . import resume as resume_run
    result = resume_run(run_dir, workers=workers, verbose=0 if quiet else 1)
    print_summary(result, Console())


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--out", default=None, help="where to write the page (default: RUN_DIR/report.html)")
def report(run_dir: str, out: str | None) -> None:
    """Write one self-contained HTML page about a run, finished or still going: ranked
    trials, learning curves, a Gantt chart of sub-epochs on workers with the utilization,
    configurations against the objective, rungs or PBT lineage. Opens without network.

    Example: cerebro report cerebro_runs/demo-20261122-101500-ab12 -o report.html
    """
    from .report import write_report
    click.echo(write_report(run_dir, out))


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--trial", default="best", show_default=True, help="a trial id such as t0003, or 'best'")
@click.option("-o", "--out", required=True, help="the file to write, e.g. model.pt")
@click.option("--torchscript", is_flag=True, help="a TorchScript module instead of the state dict with its config")
def export(run_dir: str, trial: str, out: str, torchscript: bool) -> None:
    """Save one trial's trained model: by default ``torch.save({"config", "state_dict"})``,
    with --torchscript a scripted module that loads without Cerebro or the build code.

    Example: cerebro export cerebro_runs/demo-20261122-101500-ab12 --trial best -o model.pt
    """
    import torch
    result = load(run_dir)
    ids = [t.trial_id for t in result.trials]
    if trial != "best" and trial not in ids:
        raise click.BadParameter(f"{trial!r} is not a trial of this run; trials: {', '.join(ids)}",
                                 param_hint="--trial")
    chosen = result.best if trial == "best" else result.trials[ids.index(trial)]
    if torchscript:
        torch.jit.script(chosen.model()).save(out)
    else:
        torch.save({"trial_id": chosen.trial_id, "config": chosen.config, "state_dict": chosen.state_dict()}, out)
    click.echo(f"{chosen.trial_id} ({json.dumps(chosen.config)}) -> {out}")
