"""``cerebro sql install``: Cerebro's SQL functions (MADlib's API) in PostgreSQL (docs/sql.md)."""
from __future__ import annotations

import click


@click.group()
def sql() -> None:
    """Cerebro inside PostgreSQL: MADlib's model-hopper API as SQL functions (docs/sql.md)."""


@sql.command("install")
@click.option("--dsn", required=True, help="postgresql:// URI of a superuser (plpython3u is untrusted)")
@click.option("--schema", default="cerebro", show_default=True, help="the schema to create the functions in")
@click.option("--store-root", default=None, help="directory for run directories [default: ~/cerebro_runs of the "
                                                  "server's OS user]")
@click.option("--max-workers", type=int, default=None, help="most workers one call may start [default: the "
                                                             "server's CPU count]")
def sql_install(dsn: str, schema: str, store_root: str | None, max_workers: int | None) -> None:
    """Create the schema's PL/Python functions: load_model_arch, load_model_selection_table,
    generate_model_configs, fit_multiple_model, automl, predict, predict_byom, version (and MADlib's
    names). No role but the installer may call them until granted EXECUTE (docs/sql.md).

    Example: cerebro sql install --dsn 'postgresql:///mydb?host=/var/run/postgresql'
    """
    from .sql import install
    try:
        click.echo(install(dsn, schema, store_root=store_root, max_workers=max_workers))
    except (ValueError, RuntimeError, ImportError) as error:
        raise click.ClickException(str(error)) from None
