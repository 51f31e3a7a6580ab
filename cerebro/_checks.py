"""Constraints on arguments, declared once and checked with one message format.

The bottom of the layers: it imports nothing from cerebro, so every package may use it.
A class declares its arguments as a dict from name to constraint (as scikit-learn's
``_parameter_constraints``) and checks them with :meth:`Constraint.check`, which raises
``"{name}={value!r} must be {description}"``::

    >>> Integer(low=1).check("epochs", 0)
    Traceback (most recent call last):
    ValueError: epochs=0 must be an integer >= 1

Numbers: a bool is never an integer or a number here (``epochs=True`` is a mistake), and
numpy integers and floats are. Numeric and option constraints raise ``ValueError`` for
every value they refuse, of the wrong type or out of range alike; the constraints on a
value's kind (:class:`Boolean`, :class:`Callable`, :class:`String`, :class:`Items`) raise
``TypeError``.
"""
from __future__ import annotations

import collections.abc
import numbers
from typing import Any

QUOTE_LIMIT = 200       # characters of a value a message quotes: never a 100 KB input back


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, cut short where it is long, saying how long it was.

    >>> quoted("x" * 1000, limit=12)
    "'xxxxxxxxxxx... (1002 characters)"
    """
    if isinstance(value, int) and value.bit_length() > 10_000:      # repr would refuse it (int_max_str_digits)
        return f"an integer of {value.bit_length():,} bits"
    try:
        text = repr(value)
    except Exception as error:      # noqa: BLE001 (a message about a value must not fail on it)
        return f"a {type(value).__name__} that cannot be shown ({type(error).__name__})"
    return shortened(text, limit)


def shortened(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` for a message, unquoted: its first ``limit`` characters where it is longer,
    saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class Constraint:
    """A rule one argument's value must follow.

    Subclasses say which values pass (:meth:`accepts`) and how to say the rule
    (:meth:`describe`); ``description`` replaces the latter, for a rule with its reason.
    """

    error: type[Exception] = ValueError

    def __init__(self, *, description: str | None = None) -> None:
        self.description = description

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` follows the rule."""
        raise NotImplementedError

    def describe(self) -> str:
        """The rule, as the end of "``name=value`` must be ...", e.g. ``"an integer >= 1"``."""
        raise NotImplementedError

    def check(self, name: str, value: Any) -> None:
        """Raise ``error`` naming ``name``, ``value`` and the rule unless ``value`` follows it."""
        if not self.accepts(value):
            raise self.error(f"{name}={quoted(value)} must be {self.description or self.describe()}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.description or self.describe()}>"


def _is_bool(value: Any) -> bool:
    """``bool`` or numpy's bool (no ``bool`` subclass), told apart without importing numpy."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _bounds(low: Any, high: Any, low_open: bool, high_open: bool) -> str:
    """``">= 1"``, ``"> 0"``, ``"<= 1"`` or ``"in (0, 0.5]"``; empty without bounds."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low!r}, {high!r}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low!r}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high!r}"
    return ""


def _within(value: Any, low: Any, high: Any, low_open: bool, high_open: bool) -> bool:
    """Whether ``value`` lies in the bounds; written so that NaN never does."""
    above = low is None or bool(value > low if low_open else value >= low)
    return above and (high is None or bool(value < high if high_open else value <= high))


class Integer(Constraint):
    """An integer (Python or numpy, never a bool) in ``[low, high]``; ``None``: unbounded.

    >>> Integer(low=1).describe()
    'an integer >= 1'
    """

    def __init__(self, low: int | None = None, high: int | None = None, *, description: str | None = None) -> None:
        super().__init__(description=description)
        self.low, self.high = low, high

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is an integral number, not a bool, within the bounds."""
        return isinstance(value, numbers.Integral) and not _is_bool(value) and \
            _within(value, self.low, self.high, False, False)

    def describe(self) -> str:
        """``"an integer"`` with the bounds: ``">= 1"``, ``"<= 9"`` or ``"in [0, 3]"``."""
        return f"an integer {_bounds(self.low, self.high, False, False)}".rstrip()


class Real(Constraint):
    """A number (int, float or numpy, never a bool) between ``low`` and ``high``, each
    bound included unless ``low_open`` / ``high_open``; ``None``: unbounded. NaN never passes
    a bound. With both bounds the rule reads as the interval alone.

    >>> Real(low=0, high=0.5, low_open=True).describe()
    'in (0, 0.5]'
    >>> Real(low=2).describe()
    'a number >= 2'
    """

    def __init__(self, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, description: str | None = None) -> None:
        super().__init__(description=description)
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a real number, not a bool, within the bounds (and, an integer,
        one a float can hold: 10**400 overflows every computation it would enter)."""
        if not isinstance(value, numbers.Real) or _is_bool(value):
            return False
        try:
            float(value)
        except OverflowError:
            return False
        return _within(value, self.low, self.high, self.low_open, self.high_open)

    def describe(self) -> str:
        """``"a number"`` with one bound (``">= 2"``, ``"< 1"``), or the interval alone: ``"in (0, 0.5]"``."""
        bounds = _bounds(self.low, self.high, self.low_open, self.high_open)
        return bounds if bounds.startswith("in ") else f"a number {bounds}".rstrip()


class OneOf(Constraint):
    """One of ``options``, compared with ``==`` (a bool never equals 1 here).

    >>> OneOf("min", "max").describe()
    "'min' or 'max'"
    """

    def __init__(self, *options: Any, description: str | None = None) -> None:
        super().__init__(description=description)
        self.options = options

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is hashable and equals one of the options, a bool only a bool."""
        return isinstance(value, collections.abc.Hashable) and any(
            _is_bool(value) == _is_bool(option) and value == option for option in self.options)

    def describe(self) -> str:
        """The options' reprs, the last joined with "or": ``"'a', 'b' or 'c'"``."""
        shown = [repr(option) for option in self.options]
        return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


class Boolean(Constraint):
    """``True`` or ``False`` (``numpy.bool_`` too); raises ``TypeError``."""

    error = TypeError

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a Python or numpy bool."""
        return _is_bool(value)

    def describe(self) -> str:
        """``"True or False"``."""
        return "True or False"


class Callable(Constraint):
    """Something to call: a function, a class, an object with ``__call__``; raises ``TypeError``."""

    error = TypeError

    def accepts(self, value: Any) -> bool:
        """Whether ``callable(value)``."""
        return callable(value)

    def describe(self) -> str:
        """``"callable"``."""
        return "callable"


class String(Constraint):
    """A ``str``; raises ``TypeError``."""

    error = TypeError

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a ``str``."""
        return isinstance(value, str)

    def describe(self) -> str:
        """``"a string"``."""
        return "a string"


class Items(Constraint):
    """A collection of items (list, tuple, set, dict keys, ...), not a string, whose
    letters would pass as items; raises ``TypeError``."""

    error = TypeError

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a collection other than ``str`` or ``bytes``."""
        return isinstance(value, collections.abc.Collection) and not isinstance(value, (str, bytes))

    def describe(self) -> str:
        """``"a collection of items, not a string"``."""
        return "a collection of items, not a string"


class Optional(Constraint):
    """``None``, or a value ``constraint`` accepts; anything else fails as ``constraint`` does,
    with its message."""

    def __init__(self, constraint: Constraint) -> None:
        super().__init__()
        self.constraint = constraint

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is None or accepted by the constraint."""
        return value is None or self.constraint.accepts(value)

    def describe(self) -> str:
        """The constraint's rule, ``"or None"``."""
        return f"{self.constraint.description or self.constraint.describe()} or None"

    def check(self, name: str, value: Any) -> None:
        """Pass None; fail any other value as the constraint does, with its message."""
        if value is not None:
            self.constraint.check(name, value)


class All(Constraint):
    """Every one of ``constraints``, checked in order: the first one a value fails says
    why, e.g. ``All(Integer(low=1), Integer(low=2, description="at least 2: ..."))``."""

    def __init__(self, *constraints: Constraint) -> None:
        super().__init__()
        self.constraints = constraints

    def accepts(self, value: Any) -> bool:
        """Whether every constraint accepts ``value``."""
        return all(constraint.accepts(value) for constraint in self.constraints)

    def describe(self) -> str:
        """The constraints' rules joined with "and"."""
        return " and ".join(constraint.description or constraint.describe() for constraint in self.constraints)

    def check(self, name: str, value: Any) -> None:
        """Check the constraints in order; the first that fails raises, with its message."""
        for constraint in self.constraints:
            constraint.check(name, value)
