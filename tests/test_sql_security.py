"""DESIGN invariant 8, tried as an attacker: a database role granted the SQL functions reads
and writes through them only what it may itself; no setting of its session reaches another
role, a file or code; Keras never enters the backend (whose JIT it would crash); a cancel or
terminate stops a run within seconds, its processes too, and the repeated call resumes it;
two calls never write one output table at once."""
from __future__ import annotations

import os
import re
import threading
import time

import psutil
import pytest
from _faults import epochs_journaled
from _sql import dbapi, error_of, keras, sql

import cerebro as cb
from cerebro.sql._keras_model import flat_weights

pytestmark = pytest.mark.slow
SCHEMA = "cerebro_shared"        # installed as a DBA would for other roles: a store root, one worker at most


def as_role(uri: str, role: str) -> str:
    return uri.replace("user=tester", f"user={role}")


@pytest.fixture(scope="module")
def shared(database):
    """(DBA's URI, mallory's URI, the store root): ``mallory`` may log in, use the schema
    and run its functions (what docs/sql.md tells a DBA to grant), and owns a schema of her
    own holding a copy of the digits, an architecture and a model table; she may not read
    ``public.digits_train``."""
    from _postgres import server_directory
    root = server_directory()
    cb.sql.install(database, SCHEMA, store_root=root, max_workers=1)
    model = keras.models.model_from_json(keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)]).to_json())
    weights = flat_weights({f"{i:04d}": w for i, w in enumerate(model.get_weights())}).hex()
    sql(database, "DROP SCHEMA IF EXISTS mallory CASCADE", "DROP ROLE IF EXISTS mallory", "DROP ROLE IF EXISTS nobody",
        "CREATE ROLE mallory LOGIN", "CREATE ROLE nobody LOGIN", "CREATE SCHEMA mallory AUTHORIZATION mallory",
        f"GRANT USAGE ON SCHEMA {SCHEMA} TO mallory, nobody",
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {SCHEMA} TO mallory",
        "CREATE TABLE mallory.digits AS SELECT * FROM digits_test",
        "CREATE TABLE mallory.model (mst_key integer, model_arch json, compile_params varchar, model_weights bytea)",
        f"INSERT INTO mallory.model VALUES (1, '{model.to_json()}', "
        f"$$loss='categorical_crossentropy', optimizer='SGD'$$, '\\x{weights}'::bytea)",
        "ALTER TABLE mallory.digits OWNER TO mallory", "ALTER TABLE mallory.model OWNER TO mallory")
    mallory = as_role(database, "mallory")
    sql(mallory, f"SELECT {SCHEMA}.load_model_arch('my_arch', '{model.to_json()}')",
        f"SELECT {SCHEMA}.load_model_selection_table('my_arch', 'my_mst', ARRAY[1], "
        "ARRAY[$$loss='categorical_crossentropy', optimizer='SGD'$$], ARRAY['batch_size=32'])")
    return database, mallory, root


def predict_call(test_table: str, output: str, schema: str = SCHEMA) -> str:
    return f"SELECT {schema}.predict('model', '{test_table}', 'id', 'pixels', '{output}', 'response')"


def test_the_functions_run_for_no_role_until_the_dba_grants_them(shared):
    database, _, _ = shared
    assert error_of(as_role(database, "nobody"), predict_call("mallory.digits", "nope")) == \
        "permission denied for function predict"


def test_a_role_reads_through_the_functions_only_the_tables_it_may_select(shared):
    database, mallory, _ = shared
    sql(mallory, predict_call("digits", "mine"))       # her own table: one row per row
    assert sql(mallory, "SELECT count(*) FROM mallory.mine") == sql(database, "SELECT count(*) FROM digits_test")
    # A DSN naming the superuser was the way round this: it is no setting of Cerebro's any more.
    assert "permission denied for table digits_test" in error_of(
        mallory, f"SET cerebro.dsn = '{database}'", predict_call("public.digits_test", "stolen"))
    assert sql(database, "SELECT to_regclass('mallory.stolen')") == [(None,)]


def test_functions_and_operators_of_the_callers_search_path_never_stand_in_for_postgresqls(shared):
    """``array_send`` (which reads the arrays), ``current_setting`` (which says who is a
    superuser) and ``=`` of her own schema, first on her path: none is called."""
    database, mallory, root = shared
    hijacks = [
        "CREATE FUNCTION mallory.array_send(anyarray) RETURNS bytea LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'hijacked array_send'; END$$",
        "CREATE FUNCTION mallory.current_setting(text) RETURNS text LANGUAGE sql AS $$SELECT 'on'$$",
        "CREATE FUNCTION mallory.current_setting(text, boolean) RETURNS text LANGUAGE sql AS $$SELECT 'on'$$",
        "CREATE FUNCTION mallory.eq(oid, oid) RETURNS boolean LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'hijacked ='; END$$",
        "CREATE OPERATOR mallory.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = mallory.eq)"]
    sql(mallory, "DROP FUNCTION IF EXISTS mallory.array_send(anyarray), mallory.current_setting(text), "
                 "mallory.current_setting(text, boolean) CASCADE", "DROP FUNCTION IF EXISTS mallory.eq CASCADE",
        *hijacks)
    path = "SET search_path = mallory, pg_catalog"
    # Hers again after the call: the function pinned its own only while it ran.
    assert sql(mallory, path, predict_call("digits", "despite_hijacks"),
               "SELECT pg_catalog.current_setting('search_path')") == \
        [("mallory, pg_catalog",)]
    assert sql(mallory, "SELECT count(*) FROM mallory.despite_hijacks") == \
        sql(database, "SELECT count(*) FROM digits_test")
    assert error_of(mallory, path, f"SET cerebro.store = '{root}/planted'", own_fit("planted")) == \
        f"ValueError: cerebro.store='{root}/planted': only a superuser may choose the run directory; unset it " \
        f"(RESET cerebro.store) and runs go under {root}"


def fit(schema: str, output: str, iterations: int = 1) -> str:
    return (f"SELECT {schema}.fit_multiple_model('digits_train', '{output}', 'mst_two', {iterations}, "
            "validation_table => 'digits_val', independent_varname => 'pixels', dependent_varname => 'digit')")


def own_fit(output: str) -> str:
    """Mallory's fit over her own tables."""
    return (f"SELECT {SCHEMA}.fit_multiple_model('digits', '{output}', 'my_mst', 1, independent_varname => 'pixels', "
            "dependent_varname => 'digit')")


def test_no_setting_sends_a_run_outside_the_dbas_root_or_past_its_worker_limit(shared):
    database, mallory, root = shared
    assert error_of(mallory, "SET cerebro.store = '/var/lib/postgresql'", own_fit("anywhere")) == \
        f"ValueError: cerebro.store='/var/lib/postgresql': only a superuser may choose the run directory; unset " \
        f"it (RESET cerebro.store) and runs go under {root}"
    assert error_of(mallory, own_fit("many")) == \
        "ValueError: cerebro.workers='2' is above this installation's limit of 1 (the DBA sets it with cerebro " \
        "sql install --max-workers)"


def mst_two(database: str) -> None:
    sql(database, "CREATE TABLE IF NOT EXISTS mst_two AS SELECT * FROM mst WHERE mst_key IN (2, 7)",
        "CREATE TABLE IF NOT EXISTS mst_two_summary AS SELECT * FROM mst_summary")


def test_a_session_that_trained_and_predicted_runs_jit_compiled_queries(shared):
    """TensorFlow in a backend made its next JIT-compiled query segfault the server."""
    database, _, _ = shared
    mst_two(database)
    jit = ("SET jit = on", "SET jit_above_cost = 0", "SET jit_inline_above_cost = 0",
           "SET jit_optimize_above_cost = 0")
    from _postgres import server_directory
    plan = sql(database, fit("cerebro", "jit_out"),
               "SELECT cerebro.predict('jit_out', 'digits_test', 'id', 'pixels', 'jit_predicted', 'response', "
               "mst_key => 2)",
               "CREATE OR REPLACE FUNCTION explained(q text) RETURNS SETOF text LANGUAGE plpgsql AS "
               "$$BEGIN RETURN QUERY EXECUTE 'EXPLAIN (ANALYZE, FORMAT TEXT) ' || q; END$$",
               *jit, "SELECT * FROM explained('SELECT sum(id * 2) FROM jit_predicted')",
               store=os.path.join(server_directory(), "run"))
    if not sql(database, "SELECT pg_jit_available()")[0][0]:
        pytest.skip("this PostgreSQL has no JIT (llvmjit) to crash")
    assert any(re.match(r"\s*Functions: [1-9]", line) for (line,) in plan)        # it was JIT-compiled
    assert sql(database, *jit, "SELECT sum(id * 2) FROM jit_predicted") == \
        sql(database, "SELECT sum(id * 2) FROM digits_test")


def running(process: psutil.Process) -> bool:
    """Still running: an ended process nobody has reaped yet (a zombie) is not."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Call(threading.Thread):
    """A SQL call in a session of its own, in the background; ``pid`` is its backend."""

    def __init__(self, uri: str, statement: str, store: str | None, workers: int = 2) -> None:
        super().__init__(daemon=True)
        self.uri, self.statement, self.store, self.workers = uri, statement, store, workers
        self.error: str | None = None
        self.ended = 0.0
        self.connected = threading.Event()

    def run(self) -> None:
        try:
            with dbapi.connect(self.uri, autocommit=True) as connection, connection.cursor() as cursor:
                cursor.execute(f"SET cerebro.workers = {self.workers}")
                if self.store is not None:
                    cursor.execute(f"SET cerebro.store = '{self.store}'")
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
                self.connected.set()
                cursor.execute(self.statement)
                cursor.fetchall()       # the driver reads the answer, and any error, here
        except dbapi.Error as error:
            self.error = str(error)
        finally:
            self.ended = time.monotonic()
            self.connected.set()


def training(database: str, output: str, store: str) -> Call:
    """A 12-iteration fit into ``output``, started and waited for until it has trained an epoch."""
    call = Call(database, fit("cerebro", output, iterations=12), store)
    call.start()
    assert call.connected.wait(60)
    deadline = time.monotonic() + 300
    while epochs_journaled(store) < 1 and call.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)      # polling the journal, with a deadline
    assert epochs_journaled(store) >= 1, call.error
    return call


@pytest.mark.parametrize("how", ["pg_cancel_backend", "pg_terminate_backend"])
def test_a_cancelled_or_terminated_call_stops_within_seconds_and_the_repeated_call_resumes(shared, how):
    from _postgres import server_directory
    database, _, _ = shared
    mst_two(database)
    store = os.path.join(server_directory(), "run")
    call = training(database, f"stopped_{how}", store)
    processes = psutil.Process(call.pid).children(recursive=True)    # the child, its workers
    assert len(processes) >= 3
    asked = time.monotonic()
    assert sql(database, f"SELECT {how}({call.pid})") == [(True,)]
    call.join(30)
    assert call.ended - asked < 5 and call.error is not None
    assert ("canceling statement due to user request" in call.error) if how == "pg_cancel_backend" else True
    while any(running(p) for p in processes) and time.monotonic() - asked < 5:
        time.sleep(0.05)      # polling the processes, with a deadline
    assert not [p for p in processes if running(p)]
    assert not cb.load(store).finished
    with open(os.path.join(store, "journal.jsonl")) as journal:
        done = journal.read().count('"event": "epoch_end"')
    # Called again, the run goes on from where it stopped: 2 trials x 12 epochs in all.
    sql(database, fit("cerebro", f"stopped_{how}", iterations=12), store=store)
    with open(os.path.join(store, "journal.jsonl")) as journal:
        text = journal.read()
    assert '"event": "run_resumed"' in text and text.count('"event": "epoch_end"') == 24 and done >= 1
    assert sql(database, f"SELECT count(*) FROM stopped_{how} WHERE model_weights IS NOT NULL") == [(2,)]


def test_no_role_can_hold_the_lock_of_another_roles_output_table(shared):
    """Any role may take any advisory lock: one whose key she could compute would let her
    block others' calls for as long as she likes."""
    from _postgres import server_directory
    database, mallory, _ = shared
    mst_two(database)
    with dbapi.connect(mallory, autocommit=True) as connection, connection.cursor() as cursor:
        for table in ("public.blocked", '"public"."blocked"', "blocked"):
            cursor.execute(f"SELECT pg_advisory_lock(x'63657262'::int, hashtext('{table}'))")
            cursor.fetchall()
        sql(database, fit("cerebro", "blocked"), store=os.path.join(server_directory(), "run"))
    assert sql(database, "SELECT count(model_weights) FROM blocked") == [(2,)]


def test_a_second_call_into_the_same_output_table_is_refused_before_it_trains(shared):
    from _postgres import server_directory
    database, _, _ = shared
    mst_two(database)
    first = training(database, "contended", os.path.join(server_directory(), "run"))
    try:
        assert error_of(database, fit("cerebro", "contended"), store=os.path.join(server_directory(), "run")) == \
            "ValueError: model_output_table 'contended' is being written by another call right now; wait for it " \
            "to end, or choose another name"
    finally:
        sql(database, f"SELECT pg_cancel_backend({first.pid})")
        first.join(30)
    assert first.error is not None and "canceling statement" in first.error


def test_a_call_cancelled_while_its_run_starts_is_repeated_and_trains_from_the_start(shared):
    """Cancelled before its run had anything to resume (here: as soon as its run directory,
    named by the call, appears), the same call starts clean instead of finding "another run"."""
    database, _, root = shared
    mst_two(database)
    call = Call(database, fit(SCHEMA, "started_twice"), store=None, workers=1)
    call.start()
    assert call.connected.wait(60)
    runs = os.path.join(root, "postgres", "tester", "public.started_twice")
    deadline = time.monotonic() + 120
    while not (os.path.isdir(runs) and [d for d in os.listdir(runs) if not d.startswith(".")]) \
            and time.monotonic() < deadline:
        time.sleep(0.01)      # polling for the run directory, with a deadline
    sql(database, f"SELECT pg_cancel_backend({call.pid})")
    call.join(30)
    assert call.error is not None and "canceling statement" in call.error
    sql(database, fit(SCHEMA, "started_twice"), workers=1)
    assert sql(database, "SELECT count(*), count(model_weights) FROM started_twice") == [(2, 2)]
    (run,) = [d for d in os.listdir(runs) if not d.startswith(".")]
    assert cb.load(os.path.join(runs, run)).finished


def writing_architecture(path: str) -> str:
    """A model whose JSON, loaded, would have Keras call ``plot_image_gallery`` (which saves a
    file where it is told) with a constant: safe mode lets a Lambda layer call an exported
    Keras function (found by attacking this front end as an unprivileged role)."""
    import json
    inputs = keras.Input((64,), name="x")
    model = json.loads(keras.Model(inputs, keras.layers.Dense(10, name="d")(inputs)).to_json())
    model["config"]["layers"].append({
        "module": "keras.layers", "class_name": "Lambda", "name": "evil", "registered_name": None,
        "config": {"name": "evil", "trainable": True, "dtype": "float32", "arguments": {"path": path, "rows": 1,
                                                                                          "cols": 1},
                   "function": {"module": "keras.visualization", "class_name": "function",
                                "config": "plot_image_gallery", "registered_name": None}},
        "inbound_nodes": [{"args": [{"class_name": "__numpy__", "config": {"value": [[[[255.0, 0.0, 0.0]]]],
                                                                             "dtype": "float32"}}], "kwargs": {}}]})
    return json.dumps(model)


def test_an_architecture_that_would_run_code_in_the_server_is_refused_wherever_it_comes_from(shared, tmp_path):
    database, mallory, root = shared
    target = os.path.join(root, "written_by_mallory.png")
    arch = writing_architecture(target)
    assert error_of(mallory, f"SELECT {SCHEMA}.load_keras_model('my_arch', $${arch}$$)") == \
        "ValueError: model_arch.config.layers[2]: a Lambda layer runs code of its own in the server; use Keras's " \
        "built-in layers"
    # Written into her table by hand, it is refused where the server would load it.
    sql(mallory, "DROP TABLE IF EXISTS evil_model", "CREATE TABLE evil_model AS SELECT * FROM model",
        f"UPDATE evil_model SET model_arch = $${arch}$$")
    assert error_of(mallory, predict_call("digits", "evil_out").replace("'model'", "'evil_model'")) == \
        "ValueError: model_arch.config.layers[2]: a Lambda layer runs code of its own in the server; use Keras's " \
        "built-in layers"
    assert not os.path.exists(target)
