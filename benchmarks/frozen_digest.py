"""The frozen-layer digest, side by side: the old one (class, repr and state_dict) against the
fingerprint of everything that computes a layer (cerebro/worker/_fingerprint.py), on one
backbone, median of 7 in one run.

    .venv/bin/python benchmarks/frozen_digest.py
"""
from __future__ import annotations

import hashlib
import statistics
import time

import torch

from cerebro.worker._frozen import FrozenPart


def old_digest(layer: torch.nn.Module) -> bytes:
    """What told frozen layers apart before issue 58: class, repr and weights."""
    described = hashlib.sha256(f"{type(layer).__module__}.{type(layer).__qualname__}\n{layer!r}".encode())
    for name, tensor in layer.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        described.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        described.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return described.digest()


def backbone() -> torch.nn.Sequential:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU())
              for _ in range(16)]
    return torch.nn.Sequential(*blocks, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())


def seconds(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> None:
    old, new = [], []
    for _ in range(7):
        model = backbone()
        old.append(seconds(lambda model=model: [old_digest(layer) for layer in model]))
        new.append(seconds(lambda model=model: FrozenPart(model).digests()))
    o, n = statistics.median(old), statistics.median(new)
    print("| backbone | old digest | fingerprint | ratio |\n|---|---|---|---|")
    print(f"| 16 conv blocks (0.6 M weights) | {o * 1e3:.1f} ms | {n * 1e3:.1f} ms | {n / o:.1f}x |")


if __name__ == "__main__":
    main()
