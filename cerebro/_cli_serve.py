"""``cerebro predict`` and ``cerebro export``: a trained trial applied to rows, or saved as a
model file (safetensors, ONNX, Keras, TorchScript, MLflow pyfunc)."""
from __future__ import annotations

import json
import os

import click

from .results import load
from .store._files import check_output


@click.command("predict")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("input_path", metavar="INPUT")
@click.option("-o", "--out", required=True,
              help="where to write the predictions as Parquet (with --backend spark: a directory of files)")
@click.option("--trial", default="best", show_default=True, help="a trial id such as t0003, or 'best'")
@click.option("--epoch", default="best", show_default=True, help="'best', 'last', or an epoch whose weights were kept")
@click.option("--top-k", "top_k", default=None, type=click.IntRange(min=1), help="the k likeliest classes per row")
@click.option("--workers", default=None, type=click.IntRange(min=1),
              help="worker processes (default: as the run had), or Spark tasks")
@click.option("--backend", type=click.Choice(["local", "spark"]), default="local", show_default=True,
              help="spark: Spark tasks of the SparkSession that getOrCreate finds; INPUT may then be any path "
                   "Spark reads (hdfs://...)")
@click.option("--trust", is_flag=True, help="load the run's code (build.pkl) though a run of yours did not sign it")
def predict_command(run_dir: str, input_path: str, out: str, trial: str, epoch: str, top_k: int | None,
                    workers: int | None, backend: str, trust: bool) -> None:
    """Apply a trial of a run to the rows of a Parquet file or directory (the training's
    feature columns; an id column is kept) and write the outputs, or the top-k classes, as
    Parquet, in the input's row order.

    Example: cerebro predict runs/exp1 test.parquet -o predictions.parquet --top-k 3 --workers 2
    """
    from .serve import predict
    if backend == "local" and not os.path.exists(input_path):
        raise click.BadParameter(f"{input_path!r} does not exist", param_hint="INPUT")
    if os.path.splitext(out)[1].lower() in (".csv", ".json", ".tsv", ".txt", ".xlsx"):
        raise click.BadParameter(f"{out!r}: predictions are written as Parquet; name it *.parquet", param_hint="-o")
    if backend == "spark":
        from pyspark.sql import SparkSession
        SparkSession.builder.getOrCreate()
    written = predict(run_dir, input_path, trial=trial, epoch=int(epoch) if epoch.isdigit() else epoch,
                      workers=workers, top_k=top_k, out=out, trust=trust, backend=backend)
    click.echo(written)


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--trial", default="best", show_default=True, help="a trial id such as t0003, or 'best'")
@click.option("-o", "--out", required=True,
              help="the file to write: model.safetensors, model.onnx (torch trials), model.keras (Keras trials), "
                   "model.pt with --torchscript, or a directory with --mlflow")
@click.option("--epoch", default="best", show_default=True,
              help="'best' (the trial's best epoch), 'last', or an epoch number whose weights were kept")
@click.option("--torchscript", is_flag=True, help="a TorchScript module instead of the weights with their config")
@click.option("--mlflow", "as_mlflow", is_flag=True,
              help="an MLflow pyfunc model (mlflow.pyfunc.load_model(OUT).predict(rows)) in the directory OUT")
@click.option("--trust", is_flag=True,
              help="load a run's code though no run of yours signed it (safetensors needs no trust)")
@click.option("--verbose", is_flag=True, help="show the ONNX exporter's own warnings")
def export(run_dir: str, trial: str, out: str, epoch: str, torchscript: bool, as_mlflow: bool, trust: bool,
           verbose: bool) -> None:
    """Save one trial's trained model: by default its weights as safetensors (tensors, with
    the trial id, epoch and config as JSON metadata: data only, loadable without Cerebro);
    with --torchscript a scripted module that loads without Cerebro or the build code; a name
    ending in .onnx writes ONNX (torch trials; checked with onnxruntime first); with --mlflow
    an MLflow pyfunc model; for a Keras trial, a name ending in .keras writes a .keras file.

    Example: cerebro export cerebro_runs/demo-20261122-101500-ab12 --trial best -o model.safetensors
    """
    keras_file, onnx_file = out.endswith(".keras"), out.endswith(".onnx")
    check_output(out, "out")    # before the run is read; an MLflow model's directory is made new too
    if not (torchscript or as_mlflow or keras_file or onnx_file or out.endswith(".safetensors")):
        raise click.BadParameter(f"{out!r}: the weights are written as safetensors, so name the file "
                                 f"*.safetensors (or *.onnx, *.keras for a Keras trial, --torchscript for a "
                                 f"scripted module, --mlflow for an MLflow model directory)", param_hint="--out")
    from ._extras import require
    from .serve import check_onnx_installed, export_onnx, export_torchscript
    if as_mlflow:
        require("cerebro export --mlflow", "mlflow")
    elif onnx_file:
        check_onnx_installed()
    import torch
    result = load(run_dir, trust=trust)
    ids = [t.trial_id for t in result.trials]
    if trial != "best" and trial not in ids:
        raise click.BadParameter(f"{trial!r} is not a trial of this run; trials: {', '.join(ids)}",
                                 param_hint="--trial")
    chosen = result.best if trial == "best" else result.trials[ids.index(trial)]
    if epoch not in ("best", "last") and not epoch.isdigit():
        raise click.BadParameter(f"{epoch!r} must be 'best', 'last' or an epoch number", param_hint="--epoch")
    which: int | str = int(epoch) if epoch.isdigit() else epoch
    if keras_file:
        model = chosen.model(which)
        if not hasattr(model, "save") or isinstance(model, torch.nn.Module):
            raise click.BadParameter(f"{out!r}: {chosen.trial_id} is not a Keras trial; write *.safetensors",
                                     param_hint="--out")
        model.save(out)
    elif torchscript:
        export_torchscript(chosen, out, which)
    elif as_mlflow:
        from .serve._pyfunc import save_pyfunc
        save_pyfunc(chosen, out, which)
    elif onnx_file:
        export_onnx(chosen, out, which, verbose=verbose)
    else:
        chosen.save_weights(out, which)
    click.echo(f"{chosen.trial_id} epoch {chosen.epoch_number(which)} ({json.dumps(chosen.config)}) -> {out}")
