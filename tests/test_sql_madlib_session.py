"""MADlib's documented iris session (its ``madlib_keras_fit_multiple_model`` page), typed as a
MADlib user types it with only ``madlib.`` changed to ``cerebro.``: the split, both
preprocessors, the Keras 2 architectures as MADlib prints them, the generated grid, the fit,
evaluate and predict in MADlib's output layout; and the packed tables read back as the rows
they came from."""
from __future__ import annotations

import numpy as np
import pytest
from _sql import sql
from sklearn.datasets import load_iris

pytestmark = pytest.mark.slow

# MADlib's page loads two Keras 2.1.6 models (model1.to_json(), model2.to_json()) as printed.
_DENSE = ('{{"class_name": "Dense", "config": {{"kernel_initializer": {{"class_name": "VarianceScaling", '
          '"config": {{"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}}}, '
          '"name": "dense_{n}", "kernel_constraint": null, "bias_regularizer": null, "bias_constraint": null, '
          '{extra}"activation": "{activation}", "trainable": true, "kernel_regularizer": null, '
          '"bias_initializer": {{"class_name": "Zeros", "config": {{}}}}, "units": {units}, "use_bias": true, '
          '"activity_regularizer": null}}}}')


def keras_2_json(first: int, hidden: int) -> str:
    layers = [_DENSE.format(n=first, extra='"dtype": "float32", ', activation="relu", units=10)
              .replace('"units": 10,', '"units": 10, "batch_input_shape": [null, 4],')]
    layers += [_DENSE.format(n=first + 1 + i, extra="", activation="relu", units=10) for i in range(hidden - 1)]
    layers += [_DENSE.format(n=first + hidden, extra="", activation="softmax", units=3)]
    return ('{"class_name": "Sequential", "keras_version": "2.1.6", "config": [' + ", ".join(layers)
            + '], "backend": "tensorflow"}')


_ADAM = "loss='categorical_crossentropy',optimizer='Adam(lr={})',metrics=['accuracy']"
# MADlib's install-check (test/madlib_keras_model_selection.sql_in) and the counts it asserts:
# a string that differs only in spaces or in the order of its arguments is no new model.
INSTALL_CHECK_SELECTIONS = [
    ("SELECT cerebro.load_model_selection_table('model_arch_library', 'mst_table', ARRAY[1], ARRAY["
     f"$${_ADAM.format(0.1)}$$, $$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)',metrics=['accuracy']$$, "
     f"$${_ADAM.format(0.001)}$$], ARRAY[$$batch_size=5,epochs=1$$, $$batch_size=10,epochs=1$$])", 6),
    ("SELECT cerebro.load_model_selection_table('model_arch_library', 'mst_table', ARRAY[1], ARRAY["
     f"$${_ADAM.format(0.1)}$$, $$  loss='categorical_crossentropy', optimizer='Adam(lr=0.1)',metrics=['accuracy'] $$, "
     f"$${_ADAM.format(0.001)}$$], ARRAY[$$batch_size=5,epochs=1$$, $$batch_size=10,epochs=1$$])", 4),
    ("SELECT cerebro.load_model_selection_table('model_arch_library', 'mst_table', ARRAY[1], ARRAY["
     f"$${_ADAM.format(0.1)}$$, $$metrics=  ['accuracy'], loss='categorical_crossentropy', optimizer='Adam(lr=0.1)'$$, "
     "$$loss='mse',optimizer='Adam(lr=0.001)', metrics=['accuracy']$$], "
     "ARRAY[$$batch_size=5,epochs=1$$, $$epochs=1, batch_size=5$$])", 2),
]
# The model selection page's grid search, as printed there.
MODEL_SELECTION_PAGE_GRID = """SELECT cerebro.generate_model_configs(
                'model_arch_library', -- model architecture table
                'mst_table',          -- model selection table output
                 ARRAY[1,2],          -- model ids from model architecture table
                 $$
                    {'loss': ['categorical_crossentropy'],
                     'optimizer_params_list': [ {'optimizer': ['Adam', 'SGD'], 'lr': [0.001, 0.01]} ],
                     'metrics': ['accuracy']}
                 $$,                  -- compile_param_grid
                 $$
                 { 'batch_size': [64, 128],
                   'epochs': [10]
                 }
                 $$,                  -- fit_param_grid
                 'grid'               -- search_type
                 )"""


@pytest.fixture(scope="module")
def iris(database):
    """MADlib's ``iris_data`` table: id serial, attributes numeric[], class_text varchar."""
    features, label = load_iris(return_X_y=True)
    names = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]
    rows = ", ".join(f"({i + 1}, ARRAY[{', '.join(f'{v:.1f}' for v in x)}], '{names[y]}')"
                     for i, (x, y) in enumerate(zip(features, label)))
    sql(database, "DROP TABLE IF EXISTS iris_data",
        "CREATE TABLE iris_data(id serial, attributes numeric[], class_text varchar)",
        f"INSERT INTO iris_data(id, attributes, class_text) VALUES {rows}")
    return database


def test_madlibs_iris_session_runs_as_typed(iris):
    split = sql(iris, "DROP TABLE IF EXISTS iris_train, iris_test", "SELECT setseed(0)",
                "SELECT cerebro.train_test_split('iris_data', 'iris', 0.8, NULL, NULL, NULL, NULL, TRUE)",
                "SELECT (SELECT COUNT(*) FROM iris_train), (SELECT COUNT(*) FROM iris_test), "
                "(SELECT COUNT(*) FROM (SELECT id FROM iris_train INTERSECT SELECT id FROM iris_test) AS both_)")
    assert split == [(120, 30, 0)]
    sql(iris, "DROP TABLE IF EXISTS iris_train_packed, iris_train_packed_summary",
        "SELECT cerebro.training_preprocessor_dl('iris_train', 'iris_train_packed', 'class_text', 'attributes')",
        "DROP TABLE IF EXISTS iris_test_packed, iris_test_packed_summary",
        "SELECT cerebro.validation_preprocessor_dl('iris_test', 'iris_test_packed', 'class_text', 'attributes', "
        "'iris_train_packed')")
    summary = sql(iris, "SELECT dependent_varname, independent_varname, dependent_vartype, class_text_class_values, "
                        "buffer_size, normalizing_const, num_classes FROM iris_test_packed_summary")
    assert summary == [(["class_text"], ["attributes"], ["character varying"],
                        ["Iris-setosa", "Iris-versicolor", "Iris-virginica"], 30, 1.0, [3])]
    assert sql(iris, "SELECT attributes_shape, class_text_shape, buffer_id FROM iris_train_packed") == \
        [([120, 4], [120, 3], 0)]
    for first, hidden, name in ((1, 2, "Sophie"), (4, 3, "Maria")):
        sql(iris, "SELECT cerebro.load_keras_model('model_arch_library', "
                  f"$${keras_2_json(first, hidden)}$$::json, NULL, '{name}', 'MLP')")
    for statement, count in INSTALL_CHECK_SELECTIONS:    # MADlib's install-check: its counts, de-duplicated
        assert sql(iris, "DROP TABLE IF EXISTS mst_table, mst_table_summary", statement,
                   "SELECT count(*) FROM mst_table") == [(count,)]
    # The model selection page's grid, 'epochs': [10]: each iteration of a row is 10 epochs.
    grid = sql(iris, "DROP TABLE IF EXISTS mst_table, mst_table_summary", MODEL_SELECTION_PAGE_GRID,
               "SELECT model_id, compile_params, fit_params FROM mst_table ORDER BY mst_key")
    assert len(grid) == 16 and grid[0] == (1, "loss='categorical_crossentropy', optimizer='Adam(lr=0.001)', "
                                              "metrics=['accuracy']", "batch_size=64, epochs=10")
    assert {row[2] for row in grid} == {"batch_size=64, epochs=10", "batch_size=128, epochs=10"}
    sql(iris, "DROP TABLE IF EXISTS mst_table, mst_table_summary",
        "SELECT cerebro.generate_model_configs('model_arch_library', 'mst_table', ARRAY[1,2], "
        "$${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [ {'optimizer': ['Adam'], "
        "'lr': [0.001, 0.01, 0.1]} ], 'metrics': ['accuracy']}$$, $${ 'batch_size': [4, 8], 'epochs': [1] }$$, "
        "'grid')")
    assert sql(iris, "SELECT count(*) FROM mst_table") == [(12,)]
    sql(iris, "DROP TABLE IF EXISTS iris_multi_model, iris_multi_model_summary, iris_multi_model_info",
        "SELECT cerebro.madlib_keras_fit_multiple_model('iris_train_packed', 'iris_multi_model', 'mst_table', 3, "
        "FALSE, 'iris_test_packed', 1, FALSE, 'Sophie L.', 'Model selection for iris dataset', TRUE)")
    assert sql(iris, "SELECT count(*), bool_and(status = 'completed'), bool_and(array_length(validation_metrics, 1) "
                     "= 3) FROM iris_multi_model_info") == [(12, True, True)]
    assert sql(iris, "SELECT independent_varname, dependent_varname, class_values, normalizing_const, object_table, "
                     "use_gpus, metrics_iters FROM iris_multi_model_summary") == \
        [("attributes", "class_text", ["Iris-setosa", "Iris-versicolor", "Iris-virginica"], 1.0, None, False,
          [1, 2, 3])]
    evaluated = sql(iris, "DROP TABLE IF EXISTS iris_validate",
                    "SELECT cerebro.madlib_keras_evaluate('iris_multi_model', 'iris_test_packed', 'iris_validate', "
                    "NULL, 3)", "SELECT loss, metric, metrics_type FROM iris_validate")
    validated = sql(iris, "SELECT validation_loss_final, validation_metrics_final FROM iris_multi_model_info "
                          "WHERE mst_key = 3")
    assert evaluated[0][:2] == pytest.approx(validated[0], rel=1e-4) and evaluated[0][2] == ["accuracy"]
    response = sql(iris, "DROP TABLE IF EXISTS iris_predict",
                   "SELECT cerebro.madlib_keras_predict('iris_multi_model', 'iris_test', 'id', 'attributes', "
                   "'iris_predict', 'response', FALSE, 3)",
                   "SELECT p.id, p.class_name, p.class_value = t.class_text FROM iris_predict p JOIN iris_test t "
                   "USING (id) ORDER BY id")
    assert len(response) == 30 and {row[1] for row in response} == {"class_text"}
    assert sum(right for _, _, right in response) / 30 == pytest.approx(validated[0][1], abs=1e-6)
    columns = sql(iris, "SELECT column_name FROM information_schema.columns WHERE table_name = 'iris_predict' "
                        "ORDER BY ordinal_position")
    assert [c for (c,) in columns] == ["id", "class_name", "class_value", "prob"]
    # The automl page's call (R lowered from 9 to 3 to keep the test short), then its predict.
    sql(iris, "DROP TABLE IF EXISTS automl_output, automl_output_info, automl_output_summary, automl_mst_table, "
              "automl_mst_table_summary",
        "SELECT cerebro.madlib_keras_automl('iris_train_packed', 'automl_output', 'model_arch_library', "
        "'automl_mst_table', ARRAY[1,2], $${ 'loss': ['categorical_crossentropy'], 'optimizer_params_list': [ "
        "{'optimizer': ['Adam'],'lr': [0.001, 0.1, 'log']}, {'optimizer': ['RMSprop'],'lr': [0.001, 0.1, 'log']} ], "
        "'metrics': ['accuracy'] } $$, $${'batch_size': [4, 8], 'epochs': [1]}$$, 'hyperband', "
        "'R=3, eta=3, skip_last=0', NULL, NULL, FALSE, 'iris_test_packed', 1, NULL, NULL)")
    assert sql(iris, "SELECT count(*), max(s), max(i) FROM automl_output_info") == [(5, 1, 1)]
    assert sql(iris, "SELECT automl_method, automl_params, random_state, object_table, use_gpus "
                     "FROM automl_output_summary") == [("hyperband", "R=3, eta=3, skip_last=0", None, None, False)]
    # Each configuration's own iterations whose metrics its arrays hold (metrics_compute_frequency 1).
    for iterations, metrics_iters, kept in sql(iris, "SELECT iterations, metrics_iters, "
                                                     "array_length(validation_loss, 1) FROM automl_output_info"):
        assert metrics_iters == list(range(1, iterations + 1)) and kept == iterations
    predicted = sql(iris, "DROP TABLE IF EXISTS iris_predict",
                    "SELECT cerebro.madlib_keras_predict('automl_output', 'iris_test', 'id', 'attributes', "
                    "'iris_predict', 'response', FALSE, 4)", "SELECT count(*) FROM iris_predict")
    assert predicted == [(30,)]


def test_pred_type_chooses_every_class_the_k_likeliest_or_those_above_a_probability(iris):
    if not sql(iris, "SELECT to_regclass('iris_multi_model') IS NOT NULL")[0][0]:
        pytest.skip("needs test_madlibs_iris_session_runs_as_typed's model")
    every = sql(iris, "DROP TABLE IF EXISTS iris_prob", "SELECT cerebro.madlib_keras_predict('iris_multi_model', "
                      "'iris_test', 'id', 'attributes', 'iris_prob', mst_key => 3)",
                "SELECT id, class_value, prob, rank FROM iris_prob ORDER BY id, rank")
    assert len(every) == 90
    for start in range(0, 90, 3):
        rows = every[start:start + 3]
        assert [r[3] for r in rows] == [1, 2, 3] and [r[2] for r in rows] == sorted([r[2] for r in rows], reverse=True)
        assert sum(r[2] for r in rows) == pytest.approx(1, abs=1e-5)
    top_two = sql(iris, "DROP TABLE IF EXISTS iris_top", "SELECT cerebro.madlib_keras_predict('iris_multi_model', "
                        "'iris_test', 'id', 'attributes', 'iris_top', 2, FALSE, 3)",
                  "SELECT id, class_value, prob, rank FROM iris_top ORDER BY id, rank")
    assert top_two == [row for row in every if row[3] <= 2]
    likely = sql(iris, "DROP TABLE IF EXISTS iris_likely", "SELECT cerebro.madlib_keras_predict('iris_multi_model', "
                       "'iris_test', 'id', 'attributes', 'iris_likely', 0.2, FALSE, 3)",
                 "SELECT id, class_value, prob, rank FROM iris_likely ORDER BY id, rank")
    assert likely == [row for row in every if row[2] > 0.2]


def test_packed_buffers_hold_the_rows_normalized_and_one_hot(iris):
    """Every source row is in exactly one buffer, divided by the normalizing constant, with its
    class one-hot in the summary's order; the validation table keeps its rows' order."""
    sql(iris, "DROP TABLE IF EXISTS iris_small, iris_small_summary, iris_val, iris_val_summary",
        "SELECT cerebro.training_preprocessor_dl('iris_data', 'iris_small', 'class_text', 'attributes', 40, 10)",
        "SELECT cerebro.validation_preprocessor_dl('iris_data', 'iris_val', 'class_text', 'attributes', "
        "'iris_small', 64)")
    features, label = load_iris(return_X_y=True)
    for table, sizes in (("iris_small", [38, 38, 38, 36]), ("iris_val", [50, 50, 50])):
        buffers = sql(iris, f"SELECT attributes, attributes_shape, class_text, class_text_shape FROM {table} "
                            f"ORDER BY buffer_id")
        assert [b[1] for b in buffers] == [[n, 4] for n in sizes] and [b[3] for b in buffers] == [[n, 3] for n in sizes]
        x = np.concatenate([np.frombuffer(b[0], "<f4").reshape(b[1]) for b in buffers])
        y = np.concatenate([np.frombuffer(b[2], "<i2").reshape(b[3]) for b in buffers])
        assert (y.sum(axis=1) == 1).all()
        expected = np.column_stack([features.astype(np.float32) / np.float32(10), np.eye(3)[label]]).astype(np.float32)
        got = np.column_stack([x, y]).astype(np.float32)
        if table == "iris_val":
            assert np.array_equal(got, expected)
        else:
            assert not np.array_equal(got, expected)        # shuffled
            assert np.array_equal(got[np.lexsort(got.T[::-1])], expected[np.lexsort(expected.T[::-1])])
    assert sql(iris, "SELECT normalizing_const, buffer_size FROM iris_val_summary") == [(10.0, 50)]


def test_a_packed_table_whose_bytes_do_not_fill_its_shape_is_refused_before_training(iris):
    """A packed table is data a role may have crafted: a buffer's length must match its shape."""
    from _sql import error_of
    sql(iris, "DROP TABLE IF EXISTS forged, forged_summary, forged_model, forged_model_info, forged_model_summary",
        "SELECT cerebro.training_preprocessor_dl('iris_data', 'forged', 'class_text', 'attributes')",
        "UPDATE forged SET attributes_shape = ARRAY[150, 40]", "DROP TABLE IF EXISTS forged_arch, forged_mst, "
        "forged_mst_summary", f"SELECT cerebro.load_keras_model('forged_arch', $${keras_2_json(1, 1)}$$::json)",
        "SELECT cerebro.load_model_selection_table('forged_arch', 'forged_mst', ARRAY[1], "
        "ARRAY[$$loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy']$$], ARRAY['batch_size=8'])")
    assert error_of(iris, "SELECT cerebro.fit_multiple_model('forged', 'forged_model', 'forged_mst', 1)") == \
        "ValueError: packed table 'forged': a buffer of 'attributes' holds 600 values, its shape [150, 40] says 6000"
    sql(iris, "UPDATE forged SET attributes_shape = ARRAY[150, 4]", "UPDATE forged_summary SET normalizing_const = 0")
    assert error_of(iris, "SELECT cerebro.fit_multiple_model('forged', 'forged_model', 'forged_mst', 1)") == \
        "ValueError: source_table 'forged': its summary's normalizing_const 0.0 must be a positive number"


_COMPILE = "$$ loss='categorical_crossentropy', optimizer='adam', metrics=['accuracy'] $$"


def test_madlibs_single_model_page_runs_as_typed(iris):
    """MADlib's ``madlib_keras_fit`` page: fit (``epochs=3`` per iteration), its summary,
    evaluate and predict on the model table, a validation table every 3rd iteration, and a
    warm start that continues from the table's weights."""
    if not sql(iris, "SELECT to_regclass('iris_train_packed') IS NOT NULL")[0][0]:
        pytest.skip("needs test_madlibs_iris_session_runs_as_typed's packed tables")
    sql(iris, "DROP TABLE IF EXISTS model_arch_one", "SELECT cerebro.load_keras_model('model_arch_one', "
              f"$${keras_2_json(1, 2)}$$::json, NULL, 'Sophie', 'A simple model')",
        "DROP TABLE IF EXISTS iris_model, iris_model_summary",
        f"SELECT cerebro.madlib_keras_fit('iris_train_packed', 'iris_model', 'model_arch_one', 1, {_COMPILE}, "
        "$$ batch_size=5, epochs=3 $$, 10)")
    summary = sql(iris, "SELECT source_table, model, dependent_varname, independent_varname, model_id, "
                        "num_iterations, metrics_compute_frequency, model_type, num_classes, dependent_vartype, "
                        "normalizing_const, metrics_type, loss_type, metrics_iters, class_text_class_values, "
                        "array_length(training_loss, 1), validation_loss FROM iris_model_summary")
    assert summary == [("iris_train_packed", "iris_model", ["class_text"], ["attributes"], 1, 10, 10,
                        "madlib_keras", [3], ["character varying"], 1.0, ["accuracy"], "categorical_crossentropy",
                        [10], ["Iris-setosa", "Iris-versicolor", "Iris-virginica"], 1, None)]
    assert sql(iris, "SELECT count(*), bool_and(model_weights IS NOT NULL) FROM iris_model") == [(1, True)]
    evaluated = sql(iris, "DROP TABLE IF EXISTS iris_validate",
                    "SELECT cerebro.madlib_keras_evaluate('iris_model', 'iris_test_packed', 'iris_validate')",
                    "SELECT metrics_type, loss_type FROM iris_validate")
    assert evaluated == [(["accuracy"], "categorical_crossentropy")]
    predicted = sql(iris, "DROP TABLE IF EXISTS iris_predict",
                    "SELECT cerebro.madlib_keras_predict('iris_model', 'iris_test', 'id', 'attributes', "
                    "'iris_predict')", "SELECT class_name, count(*), count(DISTINCT id) FROM iris_predict "
                                       "GROUP BY class_name")
    assert predicted == [("class_text", 90, 30)]
    # The page's "Predict BYOM": the trained weights copied into the architecture table, then
    # predicted with the classes and constant given (MADlib 2's list of lists of classes).
    byom = sql(iris, "UPDATE model_arch_library SET model_weights = iris_model.model_weights FROM iris_model "
                     "WHERE model_arch_library.model_id = 1", "DROP TABLE IF EXISTS iris_predict_byom",
               "SELECT cerebro.madlib_keras_predict_byom('model_arch_library', 1, 'iris_test', 'id', 'attributes', "
               "'iris_predict_byom', 'response', FALSE, ARRAY[ARRAY['Iris-setosa', 'Iris-versicolor', "
               "'Iris-virginica']], 1.0)",
               "SELECT id, class_name, class_value, prob FROM iris_predict_byom ORDER BY id")
    assert byom == [(id_, "dependent_var", value, prob) for id_, value, prob in sql(
        iris, "SELECT id, class_value, prob FROM iris_predict WHERE rank = 1 ORDER BY id")]
    sql(iris, "DROP TABLE IF EXISTS iris_model, iris_model_summary",
        f"SELECT cerebro.madlib_keras_fit('iris_train_packed', 'iris_model', 'model_arch_one', 1, {_COMPILE}, "
        "$$ batch_size=5, epochs=3 $$, 10, FALSE, 'iris_test_packed', 3, FALSE, 'Sophie L.', "
        "'Simple MLP for iris dataset')")
    assert sql(iris, "SELECT metrics_iters, array_length(validation_metrics, 1), name FROM iris_model_summary") == \
        [([3, 6, 9, 10], 4, "Sophie L.")]


def test_fit_params_epochs_make_each_iteration_that_many_epochs_in_fit_and_fit_multiple_model(iris):
    """``epochs=k`` makes an iteration k epochs of sequential SGD, in a model selection as in
    ``madlib_keras_fit``: a row with ``epochs=2`` trained 2 iterations has bitwise the weights
    ``madlib_keras_fit`` trains in 4 iterations of one epoch (the same trial seeds: the first
    trial of either run); a warm start at learning rate 0 leaves them as they were."""
    if not sql(iris, "SELECT to_regclass('iris_train_packed') IS NOT NULL")[0][0]:
        pytest.skip("needs test_madlibs_iris_session_runs_as_typed's packed tables")
    sql(iris, "DROP TABLE IF EXISTS arch_one", f"SELECT cerebro.load_keras_model('arch_one', "
              f"$${keras_2_json(1, 1)}$$::json)",
        "DROP TABLE IF EXISTS one_model, one_model_summary",
        f"SELECT cerebro.madlib_keras_fit('iris_train_packed', 'one_model', 'arch_one', 1, {_COMPILE}, "
        "'batch_size=8', 4)",
        "DROP TABLE IF EXISTS one_mst, one_mst_summary, one_multi, one_multi_info, one_multi_summary",
        f"SELECT cerebro.load_model_selection_table('arch_one', 'one_mst', ARRAY[1], ARRAY[{_COMPILE}], "
        "ARRAY['batch_size=8, epochs=2', 'batch_size=8'])",
        "SELECT cerebro.fit_multiple_model('iris_train_packed', 'one_multi', 'one_mst', 2, "
        "metrics_compute_frequency => 1)")
    single, = sql(iris, "SELECT model_weights FROM one_model")
    multiple = sql(iris, "SELECT model_weights FROM one_multi ORDER BY mst_key")
    assert multiple[0] == single and multiple[1] != single
    assert sql(iris, "SELECT mst_key, iterations, metrics_iters, array_length(training_loss, 1) FROM one_multi_info "
                     "ORDER BY mst_key") == [(1, 2, [1, 2], 2), (2, 2, [1, 2], 2)]
    warm = sql(iris, "SELECT cerebro.madlib_keras_fit('iris_train_packed', 'one_model', 'arch_one', 1, "
                     "$$loss='categorical_crossentropy', optimizer='SGD(lr=0.0)', metrics=['accuracy']$$, "
                     "'batch_size=8', 1, warm_start => TRUE)",
               "SELECT model_weights, num_iterations, fit_params FROM one_model, one_model_summary")
    assert warm == [(single[0], 1, "batch_size=8")]
