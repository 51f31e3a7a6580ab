"""The layers of DESIGN.md hold (the import-linter contracts in pyproject.toml), ruff finds nothing, no module
imports itself through others, and a worker process loads none of the driver's side."""
from __future__ import annotations

import os
import subprocess
import sys

import grimp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_layer_contracts_are_kept():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "0 broken" in run.stdout


def test_ruff_finds_nothing():
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    run = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    # Imports under TYPE_CHECKING count: a type checker follows them, and a reader too.
    assert cycles(grimp.build_graph("cerebro", exclude_type_checking_imports=False)) == []


def test_the_cycle_check_finds_a_cycle_and_only_the_modules_on_it():
    graph = grimp.ImportGraph()
    for importer, imported in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")]:
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == [["a", "b", "c"]]


def test_a_worker_loads_none_of_the_drivers_side():
    # A worker imports cerebro.worker; pandas, the reports and the searchers would cost each
    # worker tens of MB of resident memory it never uses.
    code = ("import sys, cerebro.worker.__main__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas' "
            "or m.startswith(('cerebro.report', 'cerebro.results', 'cerebro.observe', 'cerebro.search', "
            "'cerebro.engine', 'cerebro.backends'))))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]"


def _build_noting_the_workers_modules(config):
    import torch

    import cerebro as cb

    with open(os.path.join(config["notes"], f"{os.getpid()}.txt"), "w") as note:
        note.write(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in {"pandas", "sklearn", "optuna",
                                                                                 "plotly", "mlflow", "rich"})))
    model = torch.nn.Linear(4, 2)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                             batch_size=8)


@pytest.mark.slow
@pytest.mark.parametrize("in_memory", [True, False])
def test_a_training_worker_loads_none_of_the_drivers_libraries(tmp_path, in_memory):
    # Reading a partition must not pull pandas in through Arrow's to_numpy either.
    import numpy as np

    import cerebro as cb

    features = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    data = cb.Dataset.from_numpy(features, (features[:, 0] > 0).astype(np.int64), partitions=2, in_memory=in_memory)
    notes = tmp_path / "notes"
    notes.mkdir()
    result = cb.GridSearch(_build_noting_the_workers_modules, {"notes": cb.choice([str(notes)])}, epochs=1).fit(
        data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert result.trials[0].status == "completed"
    workers = {path.stem: path.read_text() for path in notes.iterdir() if path.stem != str(os.getpid())}
    assert len(workers) >= 1 and set(workers.values()) == {""}, workers


def test_every_public_name_resolves():
    import cerebro

    assert sorted(cerebro.__all__) == sorted(cerebro._EXPORTS)
    for name in cerebro.__all__:
        assert getattr(cerebro, name) is not None, name
    assert dir(cerebro) == sorted([*cerebro.__all__, "__version__"])     # the public API, nothing else


DEPRECATION_CHECK = """
import importlib, pkgutil, sys, warnings
warnings.filterwarnings("error", category=DeprecationWarning, module=r"cerebro(\\.|$)")
warnings.filterwarnings("error", category=PendingDeprecationWarning, module=r"cerebro(\\.|$)")
sys.path.insert(0, {tests!r})
import cerebro as cb
for module in pkgutil.walk_packages(cb.__path__, "cerebro."):
    if not module.name.endswith("__main__"):
        importlib.import_module(module.name)
from _models import build, digits
result = cb.GridSearch(build, {{"lr": cb.choice([1e-2, 3e-3])}}, epochs=2, metric="val_accuracy", mode="max").fit(
    digits(partitions=2), workers=2, store={store!r}, seed=0, verbose=1)
cb.report.write_report(result.run_dir)
print(result.best.predict(digits().train_arrays()[0][:5]).shape)
"""


@pytest.mark.slow
def test_our_code_raises_no_deprecation_warning(tmp_path):
    """`python -W error::DeprecationWarning` for what our modules do (imports, a fit, the report,
    predict): a warning that a library raises inside itself is that library's."""
    script = DEPRECATION_CHECK.format(tests=os.path.dirname(os.path.abspath(__file__)), store=str(tmp_path / "run"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("(5, 10)")
