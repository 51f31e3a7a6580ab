"""The SQL front end's test database: the digits in tables, two Keras architectures and their
model selection table, and helpers that run statements in a session (see ``conftest.py``'s
``database`` fixture)."""
from __future__ import annotations

import os

import pytest
from _docs import run_section

import cerebro as cb

dbapi = pytest.importorskip("adbc_driver_postgresql.dbapi")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
keras = pytest.importorskip("keras")

COMPILE = ["loss='categorical_crossentropy', optimizer='Adam(lr=0.003)', metrics=['accuracy']",
           "loss='categorical_crossentropy', optimizer='SGD(lr=0.05, momentum=0.9)', metrics=['accuracy']"]
FIT = ["batch_size=16, epochs=1", "batch_size=32"]


def architectures() -> list[str]:
    """Two Keras architectures as JSON: an MLP, and a wider one with dropout."""
    small = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    wide = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dropout(0.2),
                             keras.layers.Dense(10, activation="softmax")])
    return [small.to_json(), wide.to_json()]


def sql(uri: str, *statements: str, store: str | None = None, workers: int = 2) -> list[tuple]:
    """Run ``statements`` in one session (``workers`` workers, this process's Keras
    backend); the rows of the last."""
    with dbapi.connect(uri, autocommit=True) as connection, connection.cursor() as cursor:
        cursor.execute(f"SET cerebro.workers = {workers}")
        cursor.execute(f"SET cerebro.keras_backend = '{keras.backend.backend()}'")
        if store:
            cursor.execute(f"SET cerebro.store = '{store}'")
        rows: list[tuple] = []
        for statement in statements:
            cursor.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        return rows


def error_of(uri: str, *statements: str, store: str | None = None) -> str:
    """The message of the SQL error the last statement raises (its first line, after the
    driver's prefix)."""
    with pytest.raises(dbapi.Error) as raised:
        sql(uri, *statements, store=store)
    return str(raised.value).splitlines()[0].split("ERROR:  ", 1)[1]


def prepare(uri: str) -> None:
    """Install Cerebro; split the digits into ``digits_train``, ``digits_val`` and
    ``digits_test`` (id, pixels real[], digit integer) with docs/sql.md's code; the two architectures in ``arch``
    and their grid with the compile and fit parameters in ``mst``."""
    version = cb.sql.install(uri)
    assert version.startswith(f"cerebro {cb.__version__} on Python 3.11")
    run_section("docs/sql.md", "The data", 1, replace={"postgresql:///mydb": uri})     # as a user would
    for model_arch in architectures():
        sql(uri, f"SELECT cerebro.load_model_arch('arch', '{model_arch}'::json)")
    sql(uri, "SELECT cerebro.load_model_selection_table('arch', 'mst', ARRAY[1, 2], "
             f"ARRAY[$${COMPILE[0]}$$, $${COMPILE[1]}$$], ARRAY[$${FIT[0]}$$, $${FIT[1]}$$])")


def ready_database(postgres: str) -> str:
    """``postgres`` made ready by :func:`prepare`, or the test skipped saying why."""
    from _postgres import plpython_installed, server_binaries, unreadable_by_server

    from cerebro.sql._install import package_paths
    if not plpython_installed(server_binaries()):
        pytest.skip("PL/Python is not installed and could not be (apt-get install postgresql-plpython3-15)")
    hidden = unreadable_by_server([p for paths in package_paths() for p in paths])
    if hidden:
        pytest.skip(f"the PostgreSQL server's OS user cannot read {hidden}, where Cerebro is installed; the SQL "
                    f"functions import it from there (clone the project where that user can read it)")
    prepare(postgres)
    return postgres
