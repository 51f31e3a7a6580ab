"""Ranking trials by the objective, the same way in every searcher."""
from __future__ import annotations

from collections.abc import Mapping


def ranked(values: Mapping[int, float], mode: str) -> list[int]:
    """Trial indices best first; ties go to the older trial, so the order never depends on timing."""
    sign = 1.0 if mode == "min" else -1.0
    return sorted(values, key=lambda index: (sign * values[index], index))
