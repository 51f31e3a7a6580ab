"""The Python blocks of README.md and docs/*.md, and a runner that executes them as a user
would: one section's blocks, one after the other in one namespace, in the current directory.

A block whose first line starts with ``# fragment`` is one on purpose (it names what it
needs: a SparkSession, a cluster); every other block is run by a test, and
``tests/test_docs_run.py`` checks that each is.
"""
from __future__ import annotations

import contextlib
import io
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
DOCS = ("README.md", "docs/guide.md", "docs/spark.md", "docs/ray.md", "docs/dask.md", "docs/sql.md",
        "docs/security.md", "docs/extending.md")
FRAGMENT = "# fragment"


def python_blocks(doc: str) -> list[tuple[str, str]]:
    """(the ``## `` or ``### `` section it is in, its code) for each Python block of ``doc``."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = f.read()
    found, section = [], ""
    for match in re.finditer(r"^(#{2,3}) ([^\n]*)$|^```python\n(.*?)^```$", text, flags=re.M | re.S):
        if match.group(2) is not None:
            section = match.group(2)
        else:
            found.append((section, match.group(3)))
    return found


def run_section(doc: str, title: str, blocks: int, replace: dict[str, str] | None = None) -> tuple[dict, str]:
    """Run the blocks of ``doc``'s sections whose title starts with ``title`` (fragments
    left out) in one namespace; the namespace and what they printed. ``replace`` swaps
    strings a reader would change for their setup (a server's address)."""
    found = [code for section, code in python_blocks(doc)
             if section.startswith(title) and not code.startswith(FRAGMENT)]
    assert len(found) == blocks, f"{doc} § {title}: {len(found)} blocks, expected {blocks}"
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for code in found:
            for old, new in (replace or {}).items():
                assert old in code, old
                code = code.replace(old, new)
            exec(compile(code, os.path.join(ROOT, doc), "exec"), namespace)     # noqa: S102  (our own docs)
    return namespace, printed.getvalue()


def script_of_section(doc: str, title: str, blocks: int) -> str:
    """The blocks of ``doc``'s section ``title`` (fragments left out) as one script, for what
    runs only as a program of its own (a ``__main__`` guard, a cluster started and left)."""
    found = [code for section, code in python_blocks(doc) if section == title and not code.startswith(FRAGMENT)]
    assert len(found) == blocks, f"{doc} § {title}: {len(found)} blocks, expected {blocks}"
    return "\n".join(found)


def module_of_section(doc: str, title: str) -> dict:
    """What the first block of ``doc``'s section ``title`` defines (its namespace): a worked
    example's module, its classes, for the common tests to take through their properties
    without the blocks after it that run it."""
    found = [code for section, code in python_blocks(doc)
             if section.startswith(title) and not code.startswith(FRAGMENT)]
    assert found, f"{doc} § {title}: no Python block"
    namespace: dict = {}
    exec(compile(found[0], os.path.join(ROOT, doc), "exec"), namespace)     # noqa: S102  (our own docs)
    return namespace
