"""decord, imported without the CUDA stack it does not need here.

decord2 3.4's import (``decord/_ffi/base.py``, ``_preload_cuda_libs``) dlopens every shared
library under ``site-packages/nvidia/*/lib`` with RTLD_GLOBAL whenever the ``nvidia`` namespace
package is found, i.e. wherever PyTorch's CUDA build is installed: cuBLASLt, cuFFT, cuDNN, NCCL...
~370 MiB private memory in every worker that imports it, where the CPU decoder, all shmloader
uses, needs none of them (15 MiB). decord looks the package up with
``importlib.util.find_spec("nvidia")`` and, where it finds nothing, loads nothing: so while decord
imports, ``sys.modules["nvidia"]`` is None, which makes ``find_spec`` answer None (and ``import
nvidia`` fail) in this process, and nothing else. A CUDA build of decord2 (``+cuXXX`` wheels),
whose library does need those runtimes, fails to load without them; it is then imported again
the way decord means it to be.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["import_decord"]


def import_decord() -> ModuleType:
    """``import decord``, without preloading the pip-installed CUDA libraries where they are
    not needed (see the module docstring)."""
    if "decord" in sys.modules:
        return sys.modules["decord"]
    hide = "nvidia" not in sys.modules
    if hide:
        sys.modules["nvidia"] = None  # type: ignore[assignment]
    try:
        import decord
    except OSError:  # a CUDA build of decord: its library needs the runtimes it preloads
        if not hide:
            raise
        for name in [n for n in sys.modules if n == "decord" or n.startswith("decord.")]:
            del sys.modules[name]
        del sys.modules["nvidia"]
        hide = False
        import decord
    finally:
        if hide and "nvidia" in sys.modules and sys.modules["nvidia"] is None:
            del sys.modules["nvidia"]
    return decord
