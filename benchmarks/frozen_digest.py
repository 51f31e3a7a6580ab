"""The frozen-layer digest, side by side: the old one (class, repr, state_dict) against the
fingerprint of everything that computes a layer (worker/_fingerprint.py), on one backbone,
median of 7. Run: .venv/bin/python benchmarks/frozen_digest.py"""
import hashlib
import statistics
import time

import torch

from cerebro.worker._frozen import FrozenPart


def old_digest(layer):
    d = hashlib.sha256(f"{type(layer).__module__}.{type(layer).__qualname__}\n{layer!r}".encode())
    for name, t in layer.state_dict().items():
        t = t.detach().cpu().contiguous()
        d.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode()); d.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return d.digest()
def block(c): return torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c), torch.nn.ReLU())
def backbone(): torch.manual_seed(0); return torch.nn.Sequential(*[block(64) for _ in range(16)], torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
rows = []
for _ in range(7):
    m = backbone()
    t = time.perf_counter(); [old_digest(l) for l in m]; old = time.perf_counter() - t
    t = time.perf_counter(); FrozenPart(m).digests(); new = time.perf_counter() - t
    rows.append((old, new))
o, n = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
print(f"| 16 conv blocks (0.6 M weights), median of 7 | old digest {o*1e3:.1f} ms | fingerprint {n*1e3:.1f} ms | ratio {n/o:.2f} |")
