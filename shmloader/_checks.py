"""Argument checks every part shares: each raises a ValueError naming the argument, what it must
be and what it got, when the object that takes it is built (not later, in a worker)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_bool", "check_choice", "check_int", "check_seconds"]


def check_int(name: str, value: Any, minimum: int) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is an integer (not a bool) >= ``minimum``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_seconds(name: str, value: Any) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a positive number of seconds."""
    if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Raise a ValueError naming ``name`` and its ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
