"""The SQL front end in a real PostgreSQL: ``cerebro sql install``, MADlib's tables and calls
(load_model_arch, load_model_selection_table, generate_model_configs, fit_multiple_model,
automl, predict), the same bits as the same grid run from Python, and bad input refused by
name before training starts."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from _sql import COMPILE, FIT, architectures, dbapi, error_of, keras, sql

import cerebro as cb
from cerebro.sql._install import FUNCTIONS


def test_install_answers_with_the_servers_python_and_the_cli_does_the_same(database):
    assert sql(database, "SELECT cerebro.version()")[0][0].startswith(f"cerebro {cb.__version__} on Python 3.11")
    done = subprocess.run([sys.executable, "-m", "cerebro", "sql", "install", "--dsn", database, "--schema",
                           "cerebro_again"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cerebro ")
    installed = sql(database, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'cerebro_again'::regnamespace")
    assert installed[0][0] == len(FUNCTIONS) == 30


def test_an_explicit_model_id_leaves_the_next_automatic_one_free(database):
    arch = architectures()[0]
    sql(database, "DROP TABLE IF EXISTS arch_ids")
    assert sql(database, f"SELECT cerebro.load_model_arch('arch_ids', '{arch}', model_id => 10)") == [(10,)]
    assert sql(database, f"SELECT cerebro.load_keras_model('arch_ids', '{arch}')") == [(11,)]
    assert error_of(database, "SELECT cerebro.load_model_selection_table('arch_ids', 'no_mst', ARRAY[10, NULL], "
                              "ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY['batch_size=32'])") == \
        "ValueError: model_id_list=[10, None] must hold one or more model ids, none NULL"


def test_madlibs_names_and_argument_names_load_and_delete_architectures(database):
    arch = architectures()[0]
    sql(database, "DROP TABLE IF EXISTS madlib_arch")
    assert sql(database, f"SELECT cerebro.load_keras_model(keras_model_arch_table => 'madlib_arch', "
                         f"model_arch => '{arch}'::json, name => 'Sophie')") == [(1,)]
    assert sql(database, f"SELECT cerebro.load_keras_model('madlib_arch', '{arch}'::json)") == [(2,)]
    sql(database, "SELECT cerebro.delete_keras_model('madlib_arch', 1)")
    assert sql(database, "SELECT model_id FROM madlib_arch") == [(2,)]
    assert error_of(database, "SELECT cerebro.delete_keras_model(keras_model_arch_table => 'madlib_arch', "
                              "model_id => 1)") == "ValueError: model_arch_table 'madlib_arch' has no model_id 1"
    sql(database, "SELECT cerebro.delete_keras_model('madlib_arch', 2)")       # the last: the table goes too
    assert sql(database, "SELECT to_regclass('madlib_arch')") == [(None,)]


def keras2_json(bare_list: bool) -> str:
    """An MLP as Keras 2's ``model.to_json()`` wrote it (MADlib's iris example's shape): no
    ``module`` keys, ``batch_input_shape`` on the first layer; Keras 2.1 wrote the layers as
    a bare list."""
    import json

    def dense(name: str, units: int, activation: str, **more) -> dict:
        return {"class_name": "Dense", "config": {
            "name": name, "trainable": True, "dtype": "float32", "units": units, "activation": activation,
            "use_bias": True, "kernel_initializer": {"class_name": "VarianceScaling", "config": {
                "scale": 1.0, "mode": "fan_avg", "distribution": "uniform", "seed": None}},
            "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": None,
            "bias_regularizer": None, "activity_regularizer": None, "kernel_constraint": None,
            "bias_constraint": None, **more}}
    layers = [dense("dense_1", 10, "relu", batch_input_shape=[None, 4]), dense("dense_2", 3, "softmax")]
    return json.dumps({"class_name": "Sequential", "keras_version": "2.1.6", "backend": "tensorflow",
                       "config": layers if bare_list else {"name": "sequential_1", "layers": layers}})


@pytest.mark.parametrize("bare_list", [False, True])
def test_a_keras_2_model_as_madlibs_users_have_it_is_converted_on_load(database, bare_list):
    sql(database, "DROP TABLE IF EXISTS arch_keras2",
        f"SELECT cerebro.load_keras_model('arch_keras2', $${keras2_json(bare_list)}$$)")
    (stored,), = sql(database, "SELECT model_arch::text FROM arch_keras2")
    model = keras.models.model_from_json(stored)
    assert model.input_shape == (None, 4) and [tuple(w.shape) for w in model.weights] == \
        [(4, 10), (10,), (10, 3), (3,)]
    assert error_of(database, "SELECT cerebro.load_keras_model('arch_keras2', "
                              "$${\"class_name\": \"Model\", \"config\": {}}$$)") == \
        "ValueError: model_arch is a Keras 2 'Model' model; Keras 2 Sequential models are converted, others must " \
        "be saved again with Keras 3's model.to_json()"


def test_a_repeated_model_id_or_parameter_string_adds_no_configuration(database):
    """MADlib's install-check: ids [2, 1, 2] (taken in increasing order, as MADlib does) and a
    compile string given twice make 2 x 1 x 2 rows."""
    sql(database, "DROP TABLE IF EXISTS mst_dup, mst_dup_summary",
        "SELECT cerebro.load_model_selection_table('arch', 'mst_dup', ARRAY[2, 1, 2], "
        f"ARRAY[$${COMPILE[0]}$$, $${COMPILE[0]}$$], ARRAY[$${FIT[0]}$$, $${FIT[1]}$$, $${FIT[0]}$$])")
    assert sql(database, "SELECT mst_key, model_id, fit_params FROM mst_dup ORDER BY mst_key") == \
        [(1, 1, FIT[0]), (2, 1, FIT[1]), (3, 2, FIT[0]), (4, 2, FIT[1])]


def test_optimizer_names_are_taken_as_keras_spells_them():
    from cerebro.sql._keras_model import keras_model
    arch = architectures()[0]
    for name, expected in (("adam", "Adam"), ("Adam", "Adam"), ("rmsprop(lr=0.01)", "RMSprop"), ("sgd", "SGD")):
        model = keras_model(arch, f"loss='categorical_crossentropy', optimizer='{name}'", one_hot=True)
        assert type(model.optimizer).__name__ == expected
    with pytest.raises(ValueError, match=r"optimizer 'adamm' is not a class of keras.optimizers"):
        keras_model(arch, "loss='mse', optimizer='adamm'", one_hot=True)


def test_keras_2s_decay_on_madlibs_pages_is_the_time_based_schedule_it_was():
    """MADlib's model selection page passes Adam(lr=..., decay=...); Keras 3 has no such
    argument: the learning rate at step t is lr / (1 + decay * t), as Keras 2 had it."""
    import keras

    from cerebro.sql._keras_model import keras_model
    arch = architectures()[0]
    model = keras_model(arch, "loss='categorical_crossentropy', optimizer='Adam(lr=0.01, decay=0.5)'", one_hot=True)
    model.optimizer.iterations.assign(4)
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(0.01 / (1 + 0.5 * 4))
    plain = keras_model(arch, "loss='mse', optimizer='SGD(decay=0.0)'", one_hot=True)
    assert float(keras.ops.convert_to_numpy(plain.optimizer.learning_rate)) == pytest.approx(0.01)
    with pytest.raises(ValueError, match=r"decay=-1 must be a number >= 0"):
        keras_model(arch, "loss='mse', optimizer='SGD(decay=-1)'", one_hot=True)


def test_the_model_selection_table_is_every_combination_in_madlibs_order(database):
    rows = sql(database, "SELECT mst_key, model_id, compile_params, fit_params FROM mst ORDER BY mst_key")
    assert rows == [(i + 1, m, c, f) for i, (m, c, f) in
                    enumerate((m, c, f) for m in (1, 2) for c in COMPILE for f in FIT)]
    assert sql(database, "SELECT model_arch_table FROM mst_summary") == [("arch",)]


def python_grid(uri: str, store: str, epochs: int = 3) -> cb.Result:
    """The grid of ``mst``, written as a Keras user writes it in Python."""
    archs = architectures()

    def build(config):
        model = keras.models.model_from_json(archs[config["arch"]])
        optimizer = keras.optimizers.Adam(learning_rate=0.003) if config["optimizer"] == "adam" else \
            keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
        model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
        return cb.KerasTrainable(model, batch_size=config["batch_size"])
    space = {"arch": cb.choice([0, 1]), "optimizer": cb.choice(["adam", "sgd"]), "batch_size": cb.choice([16, 32])}
    validation = cb.Dataset.from_sql(uri, "digits_val", features=["pixels"], label="digit", validation=None)
    data = cb.Dataset.from_sql(uri, "digits_train", features=["pixels"], label="digit", validation=validation,
                               partitions=2)
    return cb.GridSearch(build, space, epochs=epochs, metric="val_loss").fit(data, workers=2, store=store, seed=0,
                                                                       verbose=0)


@pytest.mark.slow
def test_fit_multiple_model_writes_madlibs_tables_with_the_bits_of_the_same_grid_run_from_python(database, tmp_path):
    from _postgres import server_directory
    store = os.path.join(server_directory(), "run")
    sql(database, "SELECT cerebro.fit_multiple_model('digits_train', 'out', 'mst', 3, "
                  "validation_table => 'digits_val', metrics_compute_frequency => 1, independent_varname => 'pixels', "
                  "dependent_varname => 'digit', name => 'digits grid')", store=store)
    python = python_grid(database, str(tmp_path / "python"))

    out = sql(database, "SELECT mst_key, model_id, compile_params, fit_params, model_weights FROM out ORDER BY mst_key")
    assert [row[:4] for row in out] == sql(database, "SELECT * FROM mst ORDER BY mst_key")
    from cerebro.sql._keras_model import flat_weights
    for row, trial in zip(out, python.trials):
        assert bytes(row[4]) == flat_weights(trial.state_dict("last"))       # bitwise the same weights

    info = sql(database, "SELECT mst_key, status, iterations, metrics_type, loss_type, training_loss, "
                         "validation_loss, validation_metrics, validation_metrics_final, "
                         "array_length(metrics_elapsed_time, 1) FROM out_info ORDER BY mst_key")
    history = python.history()
    for row, trial in zip(info, python.trials):
        epochs = history[history["trial_id"] == trial.trial_id]
        assert row[1:5] == ("completed", 3, ["accuracy"], "categorical_crossentropy")
        assert row[5] == list(epochs["train_loss"]) and row[6] == list(epochs["val_loss"])
        assert row[7] == list(epochs["val_accuracy"]) and row[8] == trial.metrics["val_accuracy"]
        assert row[9] == 3
    summary = sql(database, "SELECT source_table, validation_table, model, model_info, num_iterations, "
                            "metrics_iters, name, store, seed, workers, best_mst_key FROM out_summary")
    best_key = [t.trial_id for t in python.trials].index(python.best.trial_id) + 1
    assert summary == [("digits_train", "digits_val", "out", "out_info", 3, [1, 2, 3], "digits grid", store, 0, 2,
                        best_key)]

    sql(database, f"SELECT cerebro.predict('out', 'digits_test', 'id', 'pixels', 'predicted', 'response', "
                  f"mst_key => {best_key})")
    predicted = sql(database, "SELECT id, class_name, class_value, prob FROM predicted ORDER BY id")
    test = cb.Dataset.from_sql(database, "SELECT pixels, id FROM digits_test ORDER BY id", features=["pixels"],
                               label="id", validation=None)
    order = np.argsort(test.label)
    expected = np.asarray(python.best.model().predict_on_batch(test.features[order]))
    assert [row[0] for row in predicted] == list(range(1500, 1797))        # one row per input row
    assert {row[1] for row in predicted} == {"digit"}
    assert [row[2] for row in predicted] == [str(c) for c in expected.argmax(axis=1)]
    assert [row[3] for row in predicted] == pytest.approx(list(expected.max(axis=1)), rel=1e-5)
    # MADlib's default, pred_type 'prob': a row per class, ranked by probability.
    probabilities = sql(database, f"SELECT cerebro.predict('out', 'digits_test', 'id', 'pixels', 'probs', "
                                  f"mst_key => {best_key})", "SELECT id, class_value, prob, rank FROM probs")
    assert len(probabilities) == 297 * 10
    by_id = {}
    for id_, value, prob, rank in probabilities:
        by_id.setdefault(id_, {})[rank] = (value, prob)
    first = by_id[1500]
    assert sorted(first) == list(range(1, 11)) and [first[r][1] for r in range(1, 11)] == \
        pytest.approx(sorted(expected[0], reverse=True), rel=1e-5)
    assert {first[r][0] for r in first} == {str(c) for c in range(10)}
    # MADlib's evaluate: the loss and metric over a table, as the run's validation measured them.
    evaluated = sql(database, "SELECT cerebro.madlib_keras_evaluate('out', 'digits_val', 'evaluated', mst_key => "
                              f"{best_key}, independent_varname => 'pixels', dependent_varname => 'digit')",
                    "SELECT loss, metric, metrics_type, loss_type FROM evaluated")
    validated = sql(database, f"SELECT validation_loss_final, validation_metrics_final FROM out_info "
                              f"WHERE mst_key = {best_key}")[0]
    assert evaluated[0][2:] == (["accuracy"], "categorical_crossentropy")
    assert evaluated[0][:2] == pytest.approx(validated, rel=1e-4)

    # Called again with the same arguments, the finished run is read back, not retrained.
    sql(database, "DROP TABLE out, out_info, out_summary",
        "SELECT cerebro.fit_multiple_model('digits_train', 'out', 'mst', 3, validation_table => 'digits_val', "
        "metrics_compute_frequency => 1, independent_varname => 'pixels', dependent_varname => 'digit')",
        store=store)
    assert sql(database, "SELECT model_weights FROM out ORDER BY mst_key") == [(row[4],) for row in out]
    # Another call is refused the run directory of this one.
    assert error_of(database, "SELECT cerebro.fit_multiple_model('digits_train', 'other', 'mst', 2, "
                              "independent_varname => 'pixels', dependent_varname => 'digit')", store=store) == \
        f"ValueError: the run directory {store!r} holds another run; SET cerebro.store to a new directory or remove it"


@pytest.mark.parametrize("statement, message", [
    ("SELECT cerebro.fit_multiple_model('no_such_table', 'bad_out', 'mst', 3, independent_varname => 'pixels', "
     "dependent_varname => 'digit')", "ValueError: source_table 'no_such_table' does not exist"),
    ("SELECT cerebro.fit_multiple_model('digits_train', 'bad_out', 'mst', 3, independent_varname => 'pixels', "
     "dependent_varname => 'label')",
     "ValueError: source_table 'digits_train' has no column 'label'; its columns are id, pixels, digit"),
    ("SELECT cerebro.fit_multiple_model('digits_train; DROP TABLE arch', 'bad_out', 'mst', 3)",
     "ValueError: source_table='digits_train; DROP TABLE arch' is not a table name; expected 'table' or "
     "'schema.table' (letters, digits, _ and $)"),
    ("SELECT cerebro.load_model_selection_table('arch', 'bad_mst', ARRAY[1], "
     "ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01'$$], ARRAY['batch_size=32'])",
     "ValueError: compile_params \"loss='categorical_crossentropy', optimizer='Adam(lr=0.01'\": optimizer "
     "'Adam(lr=0.01' is malformed ('(' was never closed); expected an optimizer class of keras.optimizers with "
     "literal keyword arguments, e.g. 'SGD(lr=0.01, momentum=0.9)'"),
    ("SELECT cerebro.load_model_selection_table('arch', 'bad_mst', ARRAY[1], ARRAY[$$loss='mse' optimizer='SGD'$$], "
     "ARRAY['batch_size=32'])",
     "ValueError: compile_params \"loss='mse' optimizer='SGD'\" is malformed (invalid syntax. Perhaps you forgot a "
     "comma?); expected keyword arguments with literal values, such as loss='categorical_crossentropy', "
     "optimizer='Adam(lr=0.001)', metrics=['accuracy']"),
    ("SELECT cerebro.load_model_selection_table('arch', 'bad_mst', ARRAY[3], ARRAY[$$loss='mse', optimizer='SGD'$$], "
     "ARRAY['batch_size=32'])", "ValueError: model_arch_table 'arch' has no model_id [3]"),
    ("SELECT cerebro.fit_multiple_model('digits_train', 'bad_out', 'duplicated', 3, independent_varname => 'pixels', "
     "dependent_varname => 'digit')",
     "ValueError: model_selection_table 'duplicated' has duplicate mst_key [2]; each row needs its own key"),
    ("SELECT cerebro.fit_multiple_model('digits_train', 'bad_out', 'mst', 0)",
     "ValueError: num_iterations=0 must be a positive integer"),
    ("SELECT cerebro.load_model_selection_table('arch', 'bad_mst', ARRAY[1], ARRAY[$$loss='mse', optimizer='SGD'$$], "
     "ARRAY['batch_size=32, epochs=0'])",
     "ValueError: fit_params 'batch_size=32, epochs=0': epochs=0 must be a positive integer"),
    ("SELECT cerebro.automl('digits_train', 'bad_out', 'arch', 'bad_mst', ARRAY[1], $${'loss': ['mse'], "
     "'optimizer_params_list': [{'optimizer': ['SGD']}]}$$, $${'batch_size': [32], 'epochs': [1, 2]}$$)",
     "ValueError: fit_params_grid \"{'batch_size': [32], 'epochs': [1, 2]}\": 'epochs' must be [1] for automl, whose "
     "budgets (R, num_iterations) count iterations of one epoch; give 'epochs': [1] or leave it out"),
    ("SELECT cerebro.madlib_keras_predict_byom('arch', 1, 'digits_test', 'id', 'pixels', 'bad_out', 'response')",
     "ValueError: model_arch_table 'arch', model_id 1: model_weights is NULL; load the weights with "
     "load_model_arch(..., model_weights => ...) or UPDATE arch SET model_weights = ... WHERE model_id = 1"),
    ("SELECT cerebro.madlib_keras_predict_byom('arch', 1, 'digits_test', 'id', 'pixels', 'bad_out', 'response', "
     "FALSE, ARRAY[ARRAY['a', 'b'], ARRAY['c', 'd']])",
     "ValueError: class_values=[['a', 'b'], ['c', 'd']] holds 2 lists, one per output; models with several outputs "
     "are not supported: give one list"),
    ("SELECT cerebro.madlib_keras_predict_byom('arch', 1, 'digits_test', 'id', 'pixels', 'bad_out', 3, "
     "normalizing_const => 0)", "ValueError: normalizing_const=0.0 must be a positive number (NULL: 1)"),
    *((f"SELECT cerebro.predict('any_model', 'digits_test', 'id', 'pixels', 'bad_predicted', {pred_type})",
       f"ValueError: pred_type={shown} must be 'response', 'prob', an integer >= 1 (the k likeliest classes) or a "
       f"number in [0, 1) (the classes more likely than it)") for pred_type, shown in
      (("'class'", "'class'"), ("0", "0"), ("1.5", "1.5"))),
    ("SELECT cerebro.training_preprocessor_dl('digits_train', 'bad_packed', 'digit', 'pixels', 0)",
     "ValueError: buffer_size=0 must be a positive integer"),
    ("SELECT cerebro.validation_preprocessor_dl('digits_val', 'bad_packed', 'digit', 'pixels', 'digits_train')",
     "ValueError: training_preprocessor_table 'digits_train' is not a table training_preprocessor_dl wrote (it has "
     "no summary naming its columns)"),
])
def test_bad_input_is_a_sql_error_naming_the_problem_before_any_training(database, statement, message):
    sql(database, "DROP TABLE IF EXISTS duplicated",
        "CREATE TABLE duplicated AS SELECT * FROM mst UNION ALL SELECT * FROM mst WHERE mst_key = 2",
        "CREATE TABLE IF NOT EXISTS duplicated_summary AS SELECT * FROM mst_summary")
    assert error_of(database, statement) == message
    assert sql(database, "SELECT to_regclass('bad_out'), to_regclass('bad_out_info'), to_regclass('bad_mst')") == \
        [(None, None, None)]


def test_generate_model_configs_writes_the_grid_or_seeded_draws(database):
    compile_grid = ("{'loss': ['categorical_crossentropy'], 'metrics': ['accuracy'], 'optimizer_params_list': "
                    "[{'optimizer': ['SGD'], 'lr': [0.01, 0.1], 'momentum': [0.9]}, "
                    "{'optimizer': ['Adam'], 'lr': [0.001]}]}")
    sql(database, "DROP TABLE IF EXISTS grid, grid_summary",
        f"SELECT cerebro.generate_model_configs('arch', 'grid', ARRAY[1, 2], $${compile_grid}$$, "
        "$${'batch_size': [16, 32]}$$)")
    rows = sql(database, "SELECT model_id, compile_params, fit_params FROM grid ORDER BY mst_key")
    optimizers = ["SGD(lr=0.01, momentum=0.9)", "SGD(lr=0.1, momentum=0.9)", "Adam(lr=0.001)"]
    assert rows == [(m, f"loss='categorical_crossentropy', optimizer='{o}', metrics=['accuracy']", f"batch_size={b}")
                    for m in (1, 2) for o in sorted(optimizers, key=lambda o: ("Adam" in o, o)) for b in (16, 32)]
    ranges = "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], " \
             "'lr': [0.0001, 0.1, 'log']}]}"
    draws = []
    for name in ("drawn", "drawn_again"):
        sql(database, f"DROP TABLE IF EXISTS {name}, {name}_summary",
            f"SELECT cerebro.generate_model_configs('arch', '{name}', ARRAY[1, 2], $${ranges}$$, "
            "$${'batch_size': [16, 64, 'log']}$$, search_type => 'random', num_configs => 5, random_state => 7)")
        draws.append(sql(database, f"SELECT model_id, compile_params, fit_params FROM {name} ORDER BY mst_key"))
    assert draws[0] == draws[1] and len(draws[0]) == 5 and len(set(draws[0])) == 5
    assert error_of(database, f"SELECT cerebro.generate_model_configs('arch', 'g2', ARRAY[1], $${ranges}$$, "
                              "$${'batch_size': [16]}$$)") == \
        "ValueError: search_type 'grid' enumerates candidate lists; optimizer_params_list[0]['lr'] is a range " \
        "(loguniform(0.0001, 0.1)): use search_type 'random'"


def test_generate_model_configs_appends_to_a_model_selection_table_that_exists(database):
    grid = "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [%s]}]}"
    sql(database, "DROP TABLE IF EXISTS grown, grown_summary",
        f"SELECT cerebro.generate_model_configs('arch', 'grown', ARRAY[1], $${grid % '0.01, 0.1'}$$, "
        "$${'batch_size': [16]}$$)",
        f"SELECT cerebro.generate_model_configs('arch', 'grown', ARRAY[2], $${grid % '0.001'}$$, "
        "$${'batch_size': [32]}$$)")
    assert sql(database, "SELECT mst_key, model_id, fit_params FROM grown ORDER BY mst_key") == \
        [(1, 1, "batch_size=16"), (2, 1, "batch_size=16"), (3, 2, "batch_size=32")]
    sql(database, "DROP TABLE IF EXISTS arch_other", f"SELECT cerebro.load_model_arch('arch_other', "
                                                      f"'{architectures()[0]}')")
    assert error_of(database, f"SELECT cerebro.generate_model_configs('arch_other', 'grown', ARRAY[1], "
                              f"$${grid % '0.001'}$$, $${{'batch_size': [32]}}$$)") == \
        "ValueError: model_selection_table 'grown' is of model_arch_table 'arch', not 'arch_other'; append to it " \
        "only configurations of its own architectures"


def test_hyperband_schedule_is_the_table_of_brackets_automl_runs(database):
    """MADlib's documented schedule for R=81, eta=3 (Li et al.'s table)."""
    rows = sql(database, "DROP TABLE IF EXISTS schedule", "SELECT cerebro.hyperband_schedule('schedule', 81, 3)",
               "SELECT s, i, n_i, r_i FROM schedule ORDER BY s DESC, i")
    assert [row for row in rows if row[0] == 4] == [(4, 0, 81, 1), (4, 1, 27, 3), (4, 2, 9, 9), (4, 3, 3, 27),
                                                    (4, 4, 1, 81)]
    assert [row for row in rows if row[0] == 0] == [(0, 0, 5, 81)]
    assert len(rows) == 5 + 4 + 3 + 2 + 1


def test_log_near_one_draws_values_close_to_one_by_their_distance_from_it():
    import statistics

    from cerebro.search._space import sample_config
    from cerebro.sql._grid import ConfigGrid
    grid = ConfigGrid([1], "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
                           "'momentum': [0.9, 0.999, 'log_near_one']}]}", "{'batch_size': [16]}")
    rng = np.random.default_rng(0)
    drawn = [float(grid.render(sample_config(grid.space, rng))[1].split("momentum=")[1].split(")")[0])
             for _ in range(400)]
    assert 0.9 <= min(drawn) and max(drawn) <= 0.999
    # Log-uniform in the distance: half of the draws are closer to 1 than sqrt(0.1 * 0.001) = 0.01.
    assert 0.985 < statistics.median(drawn) < 0.995
    with pytest.raises(ValueError, match=r"log_near_one takes 0 < low < high < 1"):
        ConfigGrid([1], "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
                        "'momentum': [0.9, 1.5, 'log_near_one']}]}", "{'batch_size': [16]}")


@pytest.mark.slow
@pytest.mark.parametrize("method, params, trials, iterations", [
    ("hyperband", "R=3, eta=3", 5, 3), ("tpe", "num_configs=3, num_iterations=2", 3, 2)])
def test_automl_writes_the_configurations_it_tried_and_their_models(database, method, params, trials, iterations):
    from _postgres import server_directory
    compile_grid = ("{'loss': ['categorical_crossentropy'], 'metrics': ['accuracy'], 'optimizer_params_list': "
                    "[{'optimizer': ['Adam'], 'lr': [0.0003, 0.03, 'log']}]}")
    sql(database, f"SELECT cerebro.automl('digits_train', '{method}_out', 'arch', '{method}_mst', ARRAY[1, 2], "
                  f"$${compile_grid}$$, $${{'batch_size': [16, 32]}}$$, automl_method => '{method}', "
                  f"automl_params => '{params}', validation_table => 'digits_val', independent_varname => 'pixels', "
                  "dependent_varname => 'digit')", store=os.path.join(server_directory(), "run"))
    tried = sql(database, f"SELECT mst_key, model_id, compile_params, fit_params FROM {method}_mst ORDER BY mst_key")
    out = sql(database, f"SELECT mst_key, model_id, compile_params, fit_params, model_weights IS NOT NULL "
                        f"FROM {method}_out ORDER BY mst_key")
    assert len(tried) == trials and [row[:4] for row in out] == tried and all(row[4] for row in out)
    info = sql(database, f"SELECT status, iterations FROM {method}_out_info ORDER BY mst_key")
    assert {status for status, _ in info} <= {"completed", "stopped"} and max(i for _, i in info) == iterations
    columns = [c for (c,) in sql(database, f"SELECT column_name FROM information_schema.columns WHERE table_name = "
                                           f"'{method}_out_info' ORDER BY ordinal_position")]
    if method == "hyperband":   # R=3, eta=3: bracket 1 of 3 trials (rounds of 1 and 3 epochs), bracket 0 of 2
        rounds = sql(database, "SELECT s, i, iterations FROM hyperband_out_info ORDER BY mst_key")
        assert [s for s, _, _ in rounds] == [1, 1, 1, 0, 0] and columns[-2:] == ["s", "i"]
        assert [i for _, i, _ in rounds] == [int(s == 1 and n == 3) for s, _, n in rounds]
    else:                       # as in MADlib, a Hyperopt run's info has no rounds
        assert "s" not in columns and "i" not in columns
    assert sql(database, f"SELECT automl_method, best_mst_key IS NOT NULL, automl_params, madlib_version "
                         f"FROM {method}_out_summary") == [(method, True, params, f"cerebro {cb.__version__}")]


def fit_call(output_table: str) -> str:
    return (f"SELECT cerebro.fit_multiple_model('digits_train', '{output_table}', 'mst_two', 10, "
            "validation_table => 'digits_val', independent_varname => 'pixels', dependent_varname => 'digit')")


@pytest.mark.slow
def test_a_session_killed_mid_run_resumes_it_when_called_again_with_the_same_bits(database):
    """The session's backend SIGKILLed after two epochs: the child that trains stops the run
    (it watches its parent), and the next identical call finishes it, bitwise equal to a run
    that was never interrupted."""
    import signal
    import time

    from _faults import epochs_journaled
    from _postgres import server_directory
    sql(database, "CREATE TABLE IF NOT EXISTS mst_two AS SELECT * FROM mst WHERE mst_key IN (2, 7)",
        "CREATE TABLE IF NOT EXISTS mst_two_summary AS SELECT * FROM mst_summary")
    sql(database, fit_call("steady"), store=os.path.join(server_directory(), "run"))
    store = os.path.join(server_directory(), "run")
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_sql_api as t; "
            f"t.sql({database!r}, t.fit_call('killed'), store={store!r})")
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while epochs_journaled(store) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)        # polling the journal, with a deadline
    backend = sql(database, "SELECT pid FROM pg_stat_activity WHERE query LIKE '%fit_multiple_model(%killed%' "
                            "AND pid <> pg_backend_pid()")
    assert epochs_journaled(store) >= 2 and len(backend) == 1
    os.kill(backend[0][0], signal.SIGKILL)
    client.wait(timeout=60)
    while time.monotonic() < deadline:      # the server restarts after a backend's crash
        try:
            sql(database, "SELECT 1")
            break
        except dbapi.Error:
            time.sleep(0.2)
    assert sql(database, "SELECT to_regclass('killed')") == [(None,)]
    sql(database, fit_call("killed"), store=store)
    with open(os.path.join(store, "journal.jsonl")) as journal:
        assert '"event": "run_resumed"' in journal.read()
    assert sql(database, "SELECT mst_key, model_weights FROM killed ORDER BY mst_key") == \
        sql(database, "SELECT mst_key, model_weights FROM steady ORDER BY mst_key")
    assert sql(database, "SELECT validation_loss FROM killed_info ORDER BY mst_key") == \
        sql(database, "SELECT validation_loss FROM steady_info ORDER BY mst_key")


@pytest.mark.slow
def test_warm_start_trains_on_from_the_weights_the_output_table_holds(database, tmp_path):
    """Each row starts from its weights in ``model_output_table``, with a fresh optimizer:
    bitwise what a Python build that loads those weights trains."""
    from _postgres import server_directory

    from cerebro.sql._keras_model import flat_weights, load_flat_weights
    sql(database, "CREATE TABLE mst_warm AS SELECT * FROM mst WHERE mst_key IN (1, 8)",
        "CREATE TABLE mst_warm_summary AS SELECT * FROM mst_summary")
    call = ("SELECT cerebro.fit_multiple_model('digits_train', 'warm', 'mst_warm', 1, validation_table => "
            "'digits_val', independent_varname => 'pixels', dependent_varname => 'digit'{})")
    sql(database, call.format(""), store=os.path.join(server_directory(), "run"))
    first = dict(sql(database, "SELECT mst_key, model_weights FROM warm ORDER BY mst_key"))
    # A row added since starts cold, as in MADlib. MADlib's use_caching is taken, and needs
    # nothing: a worker holds its partition throughout.
    sql(database, "INSERT INTO mst_warm SELECT 9, model_id, compile_params, fit_params FROM mst WHERE mst_key = 3",
        call.format(", warm_start => true, use_caching => true"), store=os.path.join(server_directory(), "run"))
    second = dict(sql(database, "SELECT mst_key, model_weights FROM warm ORDER BY mst_key"))
    assert sorted(second) == [1, 8, 9] and second[9] is not None
    assert sql(database, "SELECT warm_start FROM warm_summary") == [(True,)]

    archs, configs = architectures(), {1: (0, "adam", 16), 8: (1, "sgd", 32)}

    def build(config):
        arch, optimizer, batch_size = configs[config["mst_key"]]
        model = keras.models.model_from_json(archs[arch])
        model.compile(keras.optimizers.Adam(learning_rate=0.003) if optimizer == "adam" else
                      keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                      "sparse_categorical_crossentropy", metrics=["accuracy"])
        load_flat_weights(model, bytes(first[config["mst_key"]]))
        return cb.KerasTrainable(model, batch_size=batch_size)
    validation = cb.Dataset.from_sql(database, "digits_val", features=["pixels"], label="digit", validation=None)
    data = cb.Dataset.from_sql(database, "digits_train", features=["pixels"], label="digit", validation=validation,
                               partitions=2)
    python = cb.GridSearch(build, {"mst_key": cb.choice([1, 8])}, epochs=1).fit(
        data, workers=2, store=str(tmp_path / "python"), seed=0, verbose=0)
    assert [second[1], second[8]] == [flat_weights(t.state_dict("last")) for t in python.trials]
    assert second[1] != first[1] and second[8] != first[8]


@pytest.mark.slow
def test_madlibs_numeric_features_and_one_hot_label_arrays_train(database):
    """MADlib's tables hold ``numeric[]`` features (its iris example) and one-hot ``smallint[]``
    labels; they train as the same digits in ``real[]`` and class ids do."""
    from _postgres import server_directory
    sql(database, "CREATE TABLE IF NOT EXISTS mst_two AS SELECT * FROM mst WHERE mst_key IN (2, 7)",
        "CREATE TABLE IF NOT EXISTS mst_two_summary AS SELECT * FROM mst_summary",
        "DROP TABLE IF EXISTS digits_madlib",
        "CREATE TABLE digits_madlib AS SELECT id, pixels::numeric[] AS attributes, "
        "ARRAY(SELECT (i = digit)::int::smallint FROM generate_series(0, 9) AS i) AS class_one_hot FROM digits_train")
    sql(database, "SELECT cerebro.madlib_keras_fit_multiple_model('digits_madlib', 'from_madlib', 'mst_two', 2, "
                  "metrics_compute_frequency => 1, independent_varname => 'attributes', "
                  "dependent_varname => 'class_one_hot')",
        store=os.path.join(server_directory(), "run"))
    info = sql(database, "SELECT status, iterations, training_loss FROM from_madlib_info ORDER BY mst_key")
    assert [row[:2] for row in info] == [("completed", 2), ("completed", 2)]
    assert all(len(row[2]) == 2 and row[2][1] < row[2][0] for row in info)      # it learned
    sql(database, "DROP TABLE IF EXISTS madlib_predicted",
        "SELECT cerebro.madlib_keras_predict('from_madlib', 'digits_madlib', 'id', 'attributes', 'madlib_predicted', "
        "'response', mst_key => 2)")
    assert sql(database, "SELECT count(*) FROM madlib_predicted") == sql(database, "SELECT count(*) FROM digits_train")


@pytest.mark.slow
def test_text_class_labels_train_predict_and_evaluate_by_their_names(database):
    """MADlib's iris example labels rows 'Iris-setosa', ...: a class's id is its place among
    the sorted names, which the summary keeps and predict answers with."""
    from _postgres import server_directory
    sql(database, "CREATE TABLE IF NOT EXISTS mst_two AS SELECT * FROM mst WHERE mst_key IN (2, 7)",
        "CREATE TABLE IF NOT EXISTS mst_two_summary AS SELECT * FROM mst_summary",
        "DROP TABLE IF EXISTS digits_named, digits_named_val",
        "CREATE TABLE digits_named AS SELECT id, pixels, ('digit ' || digit)::varchar AS class_text FROM digits_train",
        "CREATE TABLE digits_named_val AS SELECT id, pixels, ('digit ' || digit)::varchar AS class_text "
        "FROM digits_val")
    sql(database, "SELECT cerebro.fit_multiple_model('digits_named', 'named', 'mst_two', 2, validation_table => "
                  "'digits_named_val', independent_varname => 'pixels', dependent_varname => 'class_text')",
        store=os.path.join(server_directory(), "run"))
    names = [f"digit {d}" for d in range(10)]
    assert sql(database, "SELECT dependent_vartype, class_values FROM named_summary") == \
        [("character varying", names)]
    predicted = sql(database, "DROP TABLE IF EXISTS named_predicted",
                    "SELECT cerebro.predict('named', 'digits_named_val', 'id', 'pixels', 'named_predicted', "
                    "'response', mst_key => 7)", "SELECT p.class_value = v.class_text FROM named_predicted p "
                    "JOIN digits_named_val v USING (id)")
    assert len(predicted) == 300 and sum(right for (right,) in predicted) > 150      # names, mostly right
    evaluated = sql(database, "DROP TABLE IF EXISTS named_evaluated",
                    "SELECT cerebro.evaluate('named', 'digits_named_val', 'named_evaluated', mst_key => 7, "
                    "independent_varname => 'pixels', dependent_varname => 'class_text')",
                    "SELECT loss, metric FROM named_evaluated")
    validated = sql(database, "SELECT validation_loss_final, validation_metrics_final FROM named_info "
                              "WHERE mst_key = 7")
    assert evaluated[0] == pytest.approx(validated[0], rel=1e-4)
