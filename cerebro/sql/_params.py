"""MADlib's parameter strings: ``compile_params`` and ``fit_params`` as SQL users write them,
e.g. ``loss='categorical_crossentropy', optimizer='Adam(lr=0.001)', metrics=['accuracy']``
and ``batch_size=32, epochs=1``.

They are Python keyword arguments with literal values, so they are parsed with ``ast``,
never evaluated. A string that is not of that form is refused with the rule it breaks.
"""
from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._limits import check_length, cut, listed, quoted

COMPILE_EXAMPLE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.001)', metrics=['accuracy']"
FIT_EXAMPLE = "batch_size=32, epochs=1"
_COMPILE_KEYS = ("loss", "optimizer", "metrics")
_FIT_KEYS = ("batch_size", "epochs", "verbose")


@dataclass(frozen=True)
class CompileParams:
    """What ``model.compile`` gets: the optimizer by its class name in ``keras.optimizers``
    with its arguments (MADlib's ``lr`` is Keras's ``learning_rate``), the loss's name and
    the metrics' names."""

    optimizer: str
    optimizer_args: tuple[tuple[str, Any], ...]
    loss: str
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class FitParams:
    """What training needs from ``fit_params``: the batch size, and the epochs each
    iteration trains."""

    batch_size: int
    epochs: int = 1


def keyword_arguments(text: str, what: str, example: str, *, bare_names: bool = False) -> dict[str, Any]:
    """``text`` (``a=1, b='x'``) as a dict of literals; with ``bare_names``, a bare name is
    its own string (MADlib's ``algorithm=tpe``). At most :data:`._limits.MAX_PARAMS_CHARS`
    characters: Python's parser takes time and memory in proportion, in the backend."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} {quoted(text)} is empty; expected keyword arguments such as {example}")
    check_length(text, what)
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
            raise ValueError("only name=value pairs are allowed")
        keywords = [(k.arg, k) for k in call.keywords if k.arg is not None]     # each, as checked above
        # Counted once each: names.count(name) for each name grew with their square.
        repeated = sorted(name for name, times in Counter(name for name, _ in keywords).items() if times > 1)
        if repeated:
            raise ValueError(f"{listed(repeated, quote=False)} given twice")
        return {name: k.value.id if bare_names and isinstance(k.value, ast.Name) else _literal(k)
                for name, k in keywords}
    except (SyntaxError, ValueError, RecursionError) as error:
        reason = error.msg if isinstance(error, SyntaxError) else error
        raise ValueError(f"{what} {quoted(text)} is malformed ({reason}); expected keyword arguments with literal "
                         f"values, such as {example}") from None


def _literal(keyword: ast.keyword) -> Any:
    try:
        return ast.literal_eval(keyword.value)
    except ValueError:
        name, value = cut(str(keyword.arg)), cut(ast.unparse(keyword.value))
        raise ValueError(f"{name}={value} is not a literal (quote strings: {name}='{value}')") from None


def _known_keywords(text: str, what: str, example: str, known: tuple[str, ...]) -> dict[str, Any]:
    params = keyword_arguments(text, what, example)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{what} {quoted(text)} has {listed(unknown, quote=False)}; the parameters understood are "
                         f"{', '.join(known)}")
    return params


def parse_compile_params(text: str) -> CompileParams:
    """``text`` as :class:`CompileParams`; names the first problem."""
    what = "compile_params"
    params = _known_keywords(text, what, COMPILE_EXAMPLE, _COMPILE_KEYS)
    for key in ("loss", "optimizer"):
        if not isinstance(params.get(key), str):
            raise ValueError(f"{what} {quoted(text)} needs {key}='...' as a string, e.g. {COMPILE_EXAMPLE}")
    metrics = params.get("metrics", [])
    if not isinstance(metrics, (list, tuple)) or not all(isinstance(m, str) for m in metrics):
        raise ValueError(f"{what} {quoted(text)}: metrics={quoted(metrics)} must be a list of metric names, e.g. "
                         f"['accuracy']")
    name, args = _optimizer(params["optimizer"], text)
    return CompileParams(name, args, params["loss"], tuple(metrics))


def _optimizer(text: str, params: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``'Adam'`` or ``'Adam(lr=0.01, beta_1=0.8)'`` as (class name, keyword arguments)."""
    rule = "an optimizer class of keras.optimizers with literal keyword arguments, e.g. 'SGD(lr=0.01, momentum=0.9)'"
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"compile_params {quoted(params)}: optimizer {quoted(text)} is malformed ({error.msg}); "
                         f"expected {rule}") from None
    if isinstance(node, ast.Name):
        return node.id, ()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args \
            and all(k.arg is not None for k in node.keywords):
        try:
            args = {("learning_rate" if k.arg == "lr" else k.arg): ast.literal_eval(k.value) for k in node.keywords
                    if k.arg is not None}     # each, as checked above
        except ValueError:
            raise ValueError(f"compile_params {quoted(params)}: optimizer {quoted(text)} has a value that is not a "
                             f"literal; expected {rule}") from None
        return node.func.id, tuple(sorted(args.items()))
    raise ValueError(f"compile_params {quoted(params)}: optimizer {quoted(text)} is not {rule}")


def parse_fit_params(text: str) -> FitParams:
    """``text`` as :class:`FitParams`. ``epochs=k`` makes each of the call's iterations k
    epochs (k passes over all the data), as MADlib's iteration is k passes over each
    segment's data."""
    what = "fit_params"
    params = _known_keywords(text, what, FIT_EXAMPLE, _FIT_KEYS)
    batch_size, epochs = params.get("batch_size", 32), params.get("epochs", 1)
    for name, value in (("batch_size", batch_size), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} {quoted(text)}: {name}={quoted(value)} must be a positive integer")
    return FitParams(batch_size, epochs)


def same_params(text: str, parse: Callable[[str], Any]) -> tuple:
    """What tells two parameter strings apart once parsed: spaces, the order of the
    arguments and ``lr`` for ``learning_rate`` do not (MADlib's de-duplication); ``text`` is
    checked by ``parse`` first."""
    parse(text)
    params = keyword_arguments(text, "", "")
    if isinstance(params.get("optimizer"), str):
        params["optimizer"] = _optimizer(params["optimizer"], text)
    return tuple(sorted((key, repr(value)) for key, value in params.items()))
