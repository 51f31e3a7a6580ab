"""Transfer learning: heads, learning rates and freeze depths on a pretrained backbone, with
the frozen layers computed once per partition (``TorchTrainable(frozen=...)``) against the
plain run that sends every batch of every epoch of every trial through them.

The backbone is ResNet-18 (11.2 M parameters, its ImageNet layout; random weights stand in
for pretrained ones: the compute is the same) on 32x32 images; 16 configurations: head width
{64, 256} x lr {1e-3, 3e-3, 1e-2, 3e-2} x two freeze depths (``--depths``: by default through
layer4's first block, fine-tuning its last, and through layer4, the head alone; ``layer3``
fine-tunes all of layer4, 75% of the parameters); 5 epochs, 2 workers, 4 partitions. Both
runs are made side by side in one process, in alternating order when repeated, and must
agree (their histories are compared: bitwise, or the largest difference is printed).
Reported: wall time of each fit, the speed-up, the bytes of frozen outputs the workers keep
(memory; nothing on disk).

Usage::

    .venv/bin/python benchmarks/transfer.py [--rows 2000] [--epochs 5] [--repeats 1] [--depths layer3 layer4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from _report import provenance, write_json

import cerebro as cb

WORKERS, PARTITIONS = 2, 4
HEADS = {"width": cb.choice([64, 256]), "lr": cb.choice([1e-3, 3e-3, 1e-2, 3e-2])}


class Block(torch.nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(outputs)
        self.conv2 = torch.nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(outputs)
        self.shortcut = torch.nn.Sequential() if stride == 1 and inputs == outputs else torch.nn.Sequential(
            torch.nn.Conv2d(inputs, outputs, 1, stride, bias=False), torch.nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet18() -> torch.nn.Sequential:
    """ResNet-18's layers in order (stem, layer1..layer3, layer4's two blocks, pooling), so a
    prefix is a cut."""
    def layer(inputs: int, outputs: int, stride: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(Block(inputs, outputs, stride), Block(outputs, outputs, 1))
    torch.manual_seed(2022)          # the "pretrained" weights: the same in every build
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
                            torch.nn.MaxPool2d(3, 2, 1)),
        layer(64, 64, 1), layer(64, 128, 2), layer(128, 256, 2), Block(256, 512, 2), Block(512, 512, 1),
        torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())).eval()


CUT = {"layer3": 4, "layer4.0": 5, "layer4": 7}       # layers of resnet18() frozen at each depth


class KeptInEval(torch.nn.Module):
    """The plain run's frozen part inside its model: no gradients, and eval mode kept when
    the trainer puts the model in training mode."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner.eval().requires_grad_(False)

    def train(self, mode: bool = True) -> KeptInEval:
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def parts(config: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    backbone, cut = resnet18(), CUT[config["depth"]]
    torch.manual_seed(7)
    head = torch.nn.Sequential(*backbone[cut:], torch.nn.Linear(512, config["width"]), torch.nn.ReLU(),
                               torch.nn.Linear(config["width"], 10))
    return backbone[:cut], head


def trainable(model: torch.nn.Module, head: torch.nn.Module, config: dict, **frozen: torch.nn.Module
              ) -> cb.TorchTrainable:
    trained = [p for p in head.parameters() if p.requires_grad]
    return cb.TorchTrainable(model=model, optimizer=torch.optim.Adam(trained, lr=config["lr"]),
                             loss=torch.nn.functional.cross_entropy, batch_size=64,
                             metrics={"accuracy": cb.metrics.accuracy}, **frozen)


def build_frozen(config: dict) -> cb.TorchTrainable:
    frozen, head = parts(config)
    return trainable(head, head, config, frozen=frozen)


def build_plain(config: dict) -> cb.TorchTrainable:
    frozen, head = parts(config)
    return trainable(torch.nn.Sequential(KeptInEval(frozen), head), head, config)


def data(rows: int) -> cb.Dataset:
    rng = np.random.default_rng(0)
    images = rng.normal(size=(rows, 3, 32, 32)).astype(np.float32)
    label = (images[:, 0, :16].mean(axis=(1, 2)) > 0).astype(np.int64) + 2 * (images[:, 1, 16:].mean((1, 2)) > 0)
    return cb.Dataset.from_numpy(images, label, validation=0.2, partitions=PARTITIONS, seed=0)


def stored_bytes(dataset: cb.Dataset, depths: list[str]) -> int:
    """Bytes of the frozen outputs the workers keep: each depth's, for every row."""
    rows = len(dataset.train_arrays()[1]) + len(dataset.validation_arrays()[1])
    backbone, one = resnet18(), torch.zeros(1, 3, 32, 32)
    with torch.no_grad():
        return sum(rows * backbone[:CUT[depth]](one).numel() * 4 for depth in depths)


def fit(build, dataset: cb.Dataset, space: dict, epochs: int, scratch: str, name: str) -> tuple[float, cb.Result]:
    started = time.perf_counter()
    result = cb.GridSearch(build, space, epochs=epochs, metric="val_accuracy", mode="max").fit(
        dataset, workers=WORKERS, store=os.path.join(scratch, name), seed=0, verbose=0)
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--depths", nargs=2, choices=sorted(CUT), default=["layer4.0", "layer4"])
    parser.add_argument("--out", default="benchmarks/results/transfer.json")
    args = parser.parse_args()
    dataset, space = data(args.rows), {**HEADS, "depth": cb.choice(args.depths)}
    times: dict[str, list[float]] = {"plain": [], "materialized": []}
    with tempfile.TemporaryDirectory(prefix="cerebro-transfer-") as scratch:
        for repeat in range(args.repeats):
            order = ["plain", "materialized"] if repeat % 2 == 0 else ["materialized", "plain"]
            results = {}
            for name in order:
                seconds, results[name] = fit(build_plain if name == "plain" else build_frozen, dataset, space,
                                             args.epochs, scratch, f"{name}-{repeat}")
                times[name].append(seconds)
            plain, made = (results[n].history().filter(regex="^(train|val)_") for n in ("plain", "materialized"))
            same = plain.equals(made)
            difference = float((plain - made).abs().max().max())
    medians = {name: statistics.median(values) for name, values in times.items()}
    report = {**provenance(), "torch": torch.__version__, "rows": args.rows, "epochs": args.epochs,
              "depths": args.depths,
              "configurations": 16, "workers": WORKERS, "seconds": times, "median_seconds": medians,
              "speedup": medians["plain"] / medians["materialized"], "histories_bitwise_equal": same,
              "largest_history_difference": difference, "stored_output_bytes": stored_bytes(dataset, args.depths),
              "stored_on_disk_bytes": 0}
    print(f"{'run':<14}{'median wall, s':>16}")
    for name, value in medians.items():
        print(f"{name:<14}{value:>16.1f}")
    print(f"speed-up {report['speedup']:.2f}x; histories bitwise equal: {same} (largest difference {difference:.3g}); "
          f"frozen outputs kept: {report['stored_output_bytes'] / 1e6:.1f} MB in memory, none on disk")
    write_json(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
