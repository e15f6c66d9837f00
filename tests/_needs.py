"""Optional packages in the tests: a test skips where a package is not installed, and fails where
it is installed but does not import (``pytest.importorskip`` would turn that broken install into a
skip, and a lane would pass without running what it installed)."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest


def need(module: str, reason: str | None = None) -> ModuleType:
    """``module`` imported; a skip (``reason``) where its top-level package is not installed. An
    installed package whose import fails raises its own error."""
    top = module.split(".", 1)[0]
    if importlib.util.find_spec(top) is None:
        pytest.skip(reason or f"{top} is not installed", allow_module_level=True)
    return importlib.import_module(module)
