"""Every Python block of README.md and docs/*.md runs as written in a fresh directory (here,
in test_guide_workflow.py, test_cluster_data.py, or in _sql.py's set-up of the SQL tests' database), or is marked
as a fragment on its first line, saying what it needs."""
from __future__ import annotations

import os

import pytest
from _docs import DOCS, FRAGMENT, python_blocks, run_section

import cerebro as cb

TESTS = os.path.dirname(__file__)
# (document, title prefix of its sections) -> the file whose tests run those sections' blocks
RUN_BY = {("README.md", ""): "test_docs_run.py",
          ("docs/guide.md", "Quick start"): "test_docs_run.py",
          ("docs/guide.md", "Searchers"): "test_nested_space.py",
          ("docs/guide.md", "Searching offline"): "test_simulate.py",
          ("docs/guide.md", "Several objectives"): "test_pareto_views.py",
          ("docs/guide.md", "Runs of thousands of trials"): "test_views_at_scale.py",
          ("docs/guide.md", "Selection workflow"): "test_guide_workflow.py",
          ("docs/guide.md", "Warm start"): "test_guide_workflow.py",
          ("docs/guide.md", "Learning-rate schedules"): "test_guide_workflow.py",
          ("docs/guide.md", "Transfer learning"): "test_guide_workflow.py",
          ("docs/guide.md", "Metrics"): "test_guide_workflow.py",
          ("docs/guide.md", "Applying the winner"): "test_guide_workflow.py",
          ("docs/sql.md", "The data"): "_sql.py",
          ("docs/sql.md", "Model architectures"): "test_docs_run.py",
          ("docs/ray.md", "Data in Ray"): "test_cluster_data.py",
          ("docs/dask.md", "Data in Dask"): "test_cluster_data.py",
          ("docs/extending.md", "A searcher"): "test_docs_run.py",
          ("docs/extending.md", "A backend"): "test_backends_common.py",
          ("docs/extending.md", "A trainer"): "test_trainers_common.py"}


def test_every_python_block_is_run_by_a_test_or_marked_a_fragment():
    for doc in DOCS:
        for section, code in python_blocks(doc):
            runs = [title for (d, title) in RUN_BY if d == doc and section.startswith(title)]
            assert code.startswith(FRAGMENT) or runs, f"{doc} § {section}: a block no test runs:\n{code}"
    for (doc, title), where in RUN_BY.items():
        with open(os.path.join(TESTS, where), encoding="utf-8") as f:
            source = f.read()
        assert f'"{title}"' in source and ("run_section(" in source or "script_of_section(" in source), \
            (doc, title, where)


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace, _ = run_section("README.md", "", 3)
    result = namespace["result"]
    assert len(result.trials) == 16 and all(t.status == "completed" for t in result.trials)
    assert cb.load("runs/exp1").best.trial_id == result.best.trial_id
    assert set(namespace["space"]) == {"lr", "batch_size", "hidden"}
    assert isinstance(namespace["build"]({"lr": 1e-3}), cb.KerasTrainable)     # the Keras block's


@pytest.mark.slow
def test_the_guide_quick_start_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_section("docs/guide.md", "Quick start", 1)[0]["result"]
    assert result.finished and {t.status for t in result.trials} <= {"completed", "stopped"}
    assert any(t.status == "stopped" for t in result.trials)       # ASHA stopped some at a rung


@pytest.mark.slow
def test_the_sql_guide_architectures_are_keras_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace, _ = run_section("docs/sql.md", "Model architectures", 1)
    assert [layer.units for layer in namespace["deep"].layers if hasattr(layer, "units")] == [128, 64, 10]
    assert '"class_name": "Sequential"' in namespace["mlp"].to_json()


@pytest.mark.slow
def test_the_worked_searcher_runs_as_written(tmp_path, monkeypatch):
    """Successive halving by hand: four trials, the better half of each rung going on."""
    monkeypatch.chdir(tmp_path)
    namespace, printed = run_section("docs/extending.md", "A searcher", 3)
    # Tried offline first: cb.simulate's rungs halve eight trials to one.
    assert printed.splitlines()[0] == "[1, 1, 1, 1, 2, 2, 3, 4]"
    assert namespace["simulated"].finished and namespace["simulated"].best.epochs == 4
    result = namespace["result"]
    assert sorted(t.epochs for t in result.trials) == [1, 1, 2, 3]
    assert [t.status for t in sorted(result.trials, key=lambda t: t.epochs)] == ["stopped"] * 3 + ["completed"]
    assert sorted(t.reason for t in result.trials if t.status == "stopped") == [
        "ranked 2 of 2 at a rung; the top 1 went on", "ranked 3 of 4 at a rung; the top 2 went on",
        "ranked 4 of 4 at a rung; the top 2 went on"]
    assert cb.load("runs/halving").best.trial_id == result.best.trial_id
    assert printed.splitlines()[-1].startswith(f"SuccessiveHalving(build=build, space={{'architecture': 'mlp', "
                                               f"'lr': loguniform(0.0001, 0.01), 'batch_size': 64}}, num_trials=4, "
                                               f"rung_epochs=1, metric='val_accuracy', mode='max') -> "
                                               f"{result.best.trial_id} val_accuracy 0.")
