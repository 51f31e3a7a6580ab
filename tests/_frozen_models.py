"""Models with frozen layers for the tests: a small "pretrained" backbone, its frozen prefix and
head as ``TorchTrainable(frozen=...)`` builds, and the plain build of the same models with
the layers frozen inside them, which gives the same results."""
from __future__ import annotations

import torch

import cerebro as cb
from cerebro.worker import in_preflight


class Counted(torch.nn.Module):
    """An identity that writes each batch's rows to ``path`` where a worker runs it: how
    many rows the frozen layers saw."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not in_preflight():
            with open(self.path, "a") as f:
                f.write(f"{len(x)}\n")
        return x


class KeptInEval(torch.nn.Module):
    """The plain model's frozen part: no gradients, eval mode kept in training."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner.eval().requires_grad_(False)

    def train(self, mode: bool = True) -> KeptInEval:
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def backbone(count: str | None = None) -> torch.nn.Sequential:
    torch.manual_seed(11)        # "pretrained": the same weights in every build
    first = [Counted(count)] if count else []
    return torch.nn.Sequential(*first, torch.nn.Linear(64, 48), torch.nn.BatchNorm1d(48), torch.nn.ReLU(),
                               torch.nn.Linear(48, 32), torch.nn.ReLU()).eval()


def builds(count: str | None = None, transform=None):
    """(frozen build, plain build) of the same models: freeze ``depth`` layers of the backbone."""
    def parts(config: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
        layers = backbone(count)
        cut = config["depth"] + (1 if count else 0)
        torch.manual_seed(5)
        head = torch.nn.Sequential(*layers[cut:], torch.nn.Linear(32, 10))
        return layers[:cut], head
    return both_builds(parts, transform)


def both_builds(parts, transform=None):
    """(frozen build, plain build) of the models ``parts(config)`` gives as (frozen layers, head)."""
    def made(model: torch.nn.Module, head: torch.nn.Module, config: dict, **frozen) -> cb.TorchTrainable:
        trained = [p for p in head.parameters() if p.requires_grad]
        return cb.TorchTrainable(model=model, optimizer=torch.optim.Adam(trained, lr=config.get("lr", 1e-2)),
                                 loss=torch.nn.functional.cross_entropy, batch_size=32, transform=transform,
                                 metrics={"accuracy": cb.metrics.accuracy}, **frozen)

    def frozen_build(config: dict) -> cb.TorchTrainable:
        frozen, head = parts(config)
        return made(head, head, config, frozen=frozen)

    def plain_build(config: dict) -> cb.TorchTrainable:
        frozen, head = parts(config)
        return made(torch.nn.Sequential(KeptInEval(frozen), head), head, config)
    return frozen_build, plain_build


class Scale(torch.nn.Module):
    """A layer whose function is one plain attribute: two differ in nothing a state_dict holds."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def scaled_builds(holding=None):
    """(frozen build, plain build) whose frozen layers end in ``Scale(config["scale"])``;
    ``holding(layer)`` gives the layer something more to hold first."""
    def parts(config: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
        scale = Scale(config["scale"])
        if holding is not None:
            holding(scale)
        frozen = torch.nn.Sequential(*backbone()[:2], scale)
        torch.manual_seed(5)
        return frozen, torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(48, 10))
    return both_builds(parts)
