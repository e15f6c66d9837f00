"""The Qwen-VL reference tools in the tests (and in bench/qwen.py): qwen-vl-utils' vision_process
(reading video with decord) and torchvision, which it imports, loaded from where `make test` installs it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest

from ._needs import need

torch = need("torch")


# Where `make test` installs torchvision's Python code apart from the venv's packages (the Makefile's
# TORCHVISION says why); a venv that has torchvision itself (a lane with torch's CUDA build) needs none.
REFERENCE = os.path.join(sys.prefix, "reference")


def have_torchvision() -> bool:
    if importlib.util.find_spec("torchvision") is None and os.path.isdir(REFERENCE):
        sys.path.append(REFERENCE)
        importlib.invalidate_caches()
    return importlib.util.find_spec("torchvision") is not None


def import_torchvision() -> None:
    """torchvision imported. PyPI's torchvision is a CUDA build whose C++ ops cannot load beside
    torch's CPU build, and its import then stops at the fake kernels it registers for two of them
    (``torchvision::nms``, ``qnms``): declared here, the rest of it (transforms, io) imports and
    runs as it is. Any other failure is raised."""
    try:
        importlib.import_module("torchvision")
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.library = lib  # type: ignore[attr-defined]  # kept alive: dropping it undefines them
        importlib.import_module("torchvision")


def vision_process():
    """qwen-vl-utils' vision_process, reading video with decord."""
    if importlib.util.find_spec("qwen_vl_utils") is None or not have_torchvision():
        pytest.skip("qwen-vl-utils or torchvision is not installed (make test installs both)")
    import_torchvision()
    os.environ["FORCE_QWENVL_VIDEO_READER"] = "decord"  # read when vision_process is imported
    module = importlib.import_module("qwen_vl_utils.vision_process")
    module.FORCE_QWENVL_VIDEO_READER = "decord"
    module.get_video_reader_backend.cache_clear()
    return module
