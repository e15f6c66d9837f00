"""Modules of a package imported on first use: a package's ``__getattr__`` (PEP 562) hands here.

``import shmloader`` imports nothing until a name is used, so that a worker process imports only
what its source needs; ``shmloader.engine.ring`` and the like still work without importing them
first, as they did when the package imported everything.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def submodule(package: str, name: str) -> ModuleType:
    """``package.name`` imported, where it is a module or subpackage; else the AttributeError
    Python raises for a missing attribute."""
    if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
        return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
