"""``cerebro`` on the command line: demo, run, status."""
from __future__ import annotations

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
