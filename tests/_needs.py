"""Optional packages in the tests: a test skips where a package is not installed, and fails where
it is installed but does not import (``pytest.importorskip`` would turn that broken install into a
skip, and a lane would pass without running what it installed). And what the installed PyAV can
do (``shmloader.video._av``): a test that needs a feature an older PyAV lacks (the lerobot lane's
av 15) skips naming it; a file whose encoder cannot run beside decord is written in a process of
its own."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import subprocess
import sys
from types import ModuleType
from typing import Any, Callable

import pytest

# A file written apart: a fresh interpreter imports numpy, PyAV and the test module in a few seconds.
_APART_TIMEOUT_S = 120
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def need(module: str, reason: str | None = None) -> ModuleType:
    """``module`` imported; a skip (``reason``) where its top-level package is not installed. An
    installed package whose import fails raises its own error."""
    top = module.split(".", 1)[0]
    if importlib.util.find_spec(top) is None:
        pytest.skip(reason or f"{top} is not installed", allow_module_level=True)
    return importlib.import_module(module)


def need_av(present: bool, feature: str) -> None:
    """A skip naming ``feature`` where the installed PyAV lacks it (``present``: one of the flags
    of ``shmloader.video._av``)."""
    if not present:
        import av

        from shmloader.video._av import NEWER_AV

        pytest.skip(f"{feature}: not in the installed av {av.__version__} ({NEWER_AV} has it)")


def written_apart(codec: str, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``write(*args, **kwargs)``, a function at a module's top level that encodes with PyAV's
    ``codec``: here, or in a fresh interpreter where that encoder cannot run beside decord in this
    one (``_av.encodes_beside_decord``: av 15's libvpx is not decord2's). A plain subprocess, not a
    multiprocessing one: that would leave its resource tracker running past the test."""
    from shmloader.video._av import encodes_beside_decord

    if encodes_beside_decord(codec):
        return write(*args, **kwargs)
    done = subprocess.run([sys.executable, "-c", _APART], input=pickle.dumps((write, args, kwargs)),
                          capture_output=True, timeout=_APART_TIMEOUT_S, cwd=_ROOT)
    if done.returncode:
        raise RuntimeError(f"{write.__qualname__} apart from decord failed:\n{done.stderr.decode(errors='replace')}")
    return pickle.loads(done.stdout)


# The child's answer goes out on a copy of its stdout; what encoders print on descriptor 1 goes to 2.
_APART = ("import os, pickle, sys; out = os.fdopen(os.dup(1), 'wb'); os.dup2(2, 1); "
          "f, a, k = pickle.load(sys.stdin.buffer); pickle.dump(f(*a, **k), out); out.close()")
