"""The SQL front end against Python: one grid, run by ``cerebro.fit_multiple_model`` in a
PostgreSQL session and by ``cb.GridSearch`` in a Python process.

A throwaway PostgreSQL server (as in the tests) gets the digits (1,200 training and 300
validation rows), two Keras architectures and a model selection table of 2 architectures
x 2 compile x 2 fit parameter sets. Then, alternated, ``--repeats`` times each, from a cold
start (each SQL call in a new session, each Python run in a new process, so both import
Keras and start their workers):

- ``sql``: ``SELECT cerebro.fit_multiple_model(...)`` for ``--iterations`` iterations, timed
  by the client;
- ``python``: the same grid written as a Keras user writes it (``benchmarks`` runs
  ``tests/test_sql_api.py``'s ``python_grid``), wall time of the process.

It prints the medians and their ratio, checks that every model's weights are bitwise the
same both ways. Then, ``--repeats`` times, a 12-iteration call is cancelled with
``pg_cancel_backend`` once it has trained an epoch: it prints the time from the cancel to
the call returning its error, and to the last of its processes (the child and the workers)
ending. It writes the numbers to ``--out``.

    .venv/bin/python benchmarks/sql_fit.py                 # ~5 min
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, TESTS)
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import _sql as setup  # noqa: E402
import psutil  # noqa: E402
from _postgres import plpython_installed, postgres_server, server_binaries, server_directory  # noqa: E402
from test_sql_security import mst_two, running, training  # noqa: E402

PYTHON_RUN = """
import sys, os, pickle
sys.path.insert(0, {tests!r})
os.environ["KERAS_BACKEND"] = {backend!r}
import test_sql_api as t
from cerebro.sql._keras_model import flat_weights
# the output table holds each model's last weights, as MADlib's does
result = t.python_grid({uri!r}, {store!r}, epochs={iterations})
pickle.dump([flat_weights(trial.state_dict("last")) for trial in result.trials], open({weights!r}, "wb"))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "sql_fit.json"))
    args = parser.parse_args()
    binaries = server_binaries()
    if binaries is None or not plpython_installed(binaries):
        sys.exit("PostgreSQL 15 with PL/Python is needed: apt-get install postgresql-15 postgresql-plpython3-15")
    import pickle
    import tempfile
    times: dict[str, list[float]] = {"sql": [], "python": []}
    equal = True
    with postgres_server(binaries) as uri:
        setup.prepare(uri)        # install, tables, architectures, the selection table
        scratch = tempfile.mkdtemp(prefix="cerebro-sql-fit-")
        for repeat in range(args.repeats):
            setup.close_sessions()      # a cold start: the call's session is new, as its backend
            start = time.perf_counter()
            output = f"bench_{repeat}"
            setup.sql(uri, f"SELECT cerebro.fit_multiple_model('digits_train', '{output}', 'mst', {args.iterations}, "
                           "validation_table => 'digits_val', independent_varname => 'pixels', "
                           "dependent_varname => 'digit')", store=os.path.join(server_directory(), "run"))
            times["sql"].append(time.perf_counter() - start)
            weights_file = os.path.join(scratch, f"weights_{repeat}.pkl")
            code = PYTHON_RUN.format(tests=TESTS, backend=setup.keras.backend.backend(), uri=uri,
                                     store=os.path.join(scratch, f"python_{repeat}"), iterations=args.iterations,
                                     weights=weights_file)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times["python"].append(time.perf_counter() - start)
            in_sql = [bytes(row[0]) for row in setup.sql(uri, f"SELECT model_weights FROM {output} ORDER BY mst_key")]
            with open(weights_file, "rb") as f:
                equal &= in_sql == pickle.load(f)
        cancel = cancel_times(uri, args.repeats)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"{'':12}{'median s':>10}  runs")
    for kind, values in times.items():
        print(f"{kind:12}{medians[kind]:>10.1f}  {', '.join(f'{v:.1f}' for v in values)}")
    print(f"sql / python: {medians['sql'] / medians['python']:.2f}; weights bitwise equal: {equal}")
    for kind, values in cancel.items():
        print(f"pg_cancel_backend -> {kind}: median {statistics.median(values):.2f} s "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"iterations": args.iterations, "times": times, "medians": medians,
                   "ratio": medians["sql"] / medians["python"], "weights_equal": equal, "cancel": cancel}, f,
                  indent=1)


def cancel_times(uri: str, repeats: int) -> dict[str, list[float]]:
    """Seconds from ``pg_cancel_backend`` to the call's error, and to its processes' end."""
    mst_two(uri)
    times: dict[str, list[float]] = {"call returned": [], "processes ended": []}
    for repeat in range(repeats):
        call = training(uri, f"cancelled_{repeat}", os.path.join(server_directory(), "run"))
        processes = psutil.Process(call.pid).children(recursive=True)
        asked = time.monotonic()
        setup.sql(uri, f"SELECT pg_cancel_backend({call.pid})")
        call.join(60)
        times["call returned"].append(call.ended - asked)
        while any(running(p) for p in processes):
            time.sleep(0.01)      # polling the processes
        times["processes ended"].append(time.monotonic() - asked)
        assert call.error and "canceling statement" in call.error, call.error
    return times


if __name__ == "__main__":
    main()
