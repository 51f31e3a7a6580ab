"""The SQL front end's test database: the digits in tables, two Keras architectures and their
model selection table, and helpers that run statements in a session (see ``conftest.py``'s
``database`` fixture)."""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

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


# One session per server, role and thread, as a psql user has: its backend imports Cerebro
# (about 2 s of CPU) once, not at each call. DISCARD ALL starts each call with the session's
# settings, temporary tables and search_path as a new session has them.
_SESSIONS: dict[tuple[str, int], Any] = {}


def session(uri: str) -> Any:
    """This thread's open session on ``uri``, connected anew where its backend has ended (a
    test killed it, or the server restarted after a crash)."""
    key = (uri, threading.get_ident())
    connection = _SESSIONS.get(key)
    if connection is not None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("DISCARD ALL")
            return connection
        except dbapi.Error:
            with contextlib.suppress(dbapi.Error):
                connection.close()
    connection = _SESSIONS[key] = dbapi.connect(uri, autocommit=True)
    return connection


def close_sessions() -> None:
    while _SESSIONS:
        with contextlib.suppress(dbapi.Error):
            _SESSIONS.popitem()[1].close()


def sql(uri: str, *statements: str, store: str | None = None, workers: int = 2) -> list[tuple]:
    """Run ``statements`` in a session as new (``workers`` workers, this process's Keras
    backend); the rows of the last."""
    with session(uri).cursor() as cursor:
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
