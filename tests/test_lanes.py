"""What the field installs: the lower bounds pyproject.toml declares are the versions the oldest
lane tests (constraints-oldest.txt), every extra is installed by the lanes, and a worker that
decodes stays lean where PyTorch's CUDA build put its libraries in site-packages/nvidia.

The lanes themselves are ``make test-newest``, ``make test-oldest`` and ``make test-lerobot``
(tests/lanes.py).
"""

from __future__ import annotations

import importlib.util
import re

import psutil
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import shmloader
from shmloader.samples import read_codes

from ._needs import need
from ._pyproject import ROOT, pyproject
from .lanes import EXTRAS, LANES, LEROBOT, OLDEST

# What a decoding worker may hold of its own (Python, numpy, PyAV's and decord's FFmpeg, a batch
# in flight) where decord preloads nothing: the bound is about 1.6x the most measured in the lab and
# the lanes (the note of the change that set it gives the figures); a worker that preloads the CUDA
# libraries of torch's CUDA build holds ~400 MiB (cuBLASLt alone maps 522 MiB), far past it.
_WORKER_USS = 96 << 20
# A width decord copies out on every CPU: its RGB rows (3 x 64 bytes) fill whole rows of the widest
# SIMD alignment FFmpeg picks (64 bytes with AVX-512), where widths such as 32 fail on some CPUs.
_ANY_CPU_SIZE = (64, 64)


def oldest_pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in OLDEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"constraints-oldest.txt: {line} is no exact pin"
        name = canonicalize_name(req.name)
        assert name not in pins, f"constraints-oldest.txt pins {name} twice"
        pins[name] = Version(spec.version)
    return pins


def test_every_lower_bound_is_what_the_oldest_lane_installs():
    """Each requirement of pyproject.toml, core or extra, declares a lower bound, and the oldest
    lane pins exactly that version: a bound raised in one place and not the other fails here."""
    project = pyproject()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    pins = oldest_pins()
    wrong = []
    for req in reqs:
        lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
        assert len(lower) == 1, f"{req}: one lower bound (>=) wanted"
        name = canonicalize_name(req.name)
        if pins.get(name) != lower[0]:
            wrong.append(f"{req} but constraints-oldest.txt has {pins.get(name, 'no pin')}")
    assert wrong == [], "\n".join(wrong)


def test_the_lanes_install_every_extra():
    assert set(EXTRAS) == set(pyproject()["project"]["optional-dependencies"])
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"tests/lanes\.py newest \$\$v", makefile) and "tests/lanes.py oldest 3.10" in makefile


def test_the_lerobot_lane_installs_what_lerobot_pins_beside_shmloader():
    """The lerobot lane: LeRobot's dataset extra (its av pin) with shmloader and every extra (as
    the other lanes), on a Python LeRobot 0.6 installs on, run by `make test-lerobot`. Every PyAV
    it can pin is one our `av` requirement admits."""
    req = Requirement(LEROBOT)
    assert canonicalize_name(req.name) == "lerobot" and req.extras == {"dataset"} and Version("0.6.1") in req.specifier
    extras = pyproject()["project"]["optional-dependencies"]
    ours = next(Requirement(r) for r in pyproject()["project"]["dependencies"] if Requirement(r).name == "av")
    assert Version("15.0") in ours.specifier and Version("15.1.0") in ours.specifier  # lerobot 0.6: av>=15,<16
    for extra in extras.values():  # no extra asks for a PyAV the lane cannot have
        assert all(Version("15.1.0") in Requirement(r).specifier for r in extra if Requirement(r).name == "av")
    assert "lerobot" in LANES and "tests/lanes.py lerobot 3.12" in (ROOT / "Makefile").read_text()


def test_a_decoding_worker_loads_no_cuda_library(videos):
    """decord, imported in a worker to decode, leaves the libraries under site-packages/nvidia
    (PyTorch's CUDA build: cuBLAS, cuDNN, NCCL...) unloaded, and the worker's private memory
    small. Where torch's CPU build is installed there is no such folder and only the memory
    bound speaks; the newest lane installs the CUDA build, as GPU users have it."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths[:4], labels[:4], clip_len=4, size=_ANY_CPU_SIZE,
                                 decoder="decord")
    with shmloader.Loader(clips, batch_size=2, workers=1, epochs=1) as loader:
        it = iter(loader)
        batch = next(it)
        ids, frames = read_codes(batch["video"])
        assert (ids == batch["index"][:, None]).all() and (frames == batch["frames"]).all()
        (pid,) = loader.worker_pids()
        mapped = {line.split()[-1] for line in open(f"/proc/{pid}/maps") if line.rstrip().endswith(".so")
                  or ".so." in line}
        uss = psutil.Process(pid).memory_full_info().uss
        del batch, it
    assert any("libdecord" in p for p in mapped), "the worker did not load decord: nothing was checked"
    nvidia = importlib.util.find_spec("nvidia")
    roots = list(nvidia.submodule_search_locations or []) if nvidia is not None else []
    cuda = sorted(p for p in mapped for root in roots if p.startswith(root))
    assert cuda == [], f"the worker loaded {len(cuda)} CUDA libraries: {cuda[:5]}"
    print(f"decoding worker USS {uss / 2**20:.1f} MiB")  # the figure the bound's margin is set from
    assert uss < _WORKER_USS, f"worker USS {uss / 2**20:.0f} MiB"


def test_a_broken_install_fails_where_a_missing_one_skips(tmp_path, monkeypatch):
    """need(): a package that is not installed skips its tests; one that is installed and fails to
    import (an extra's minimum beside a dependency that dropped a module) fails with its error.
    No test skips through pytest.importorskip, which turns both into a skip."""
    pkg = tmp_path / "shm_broken_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from shm_broken_pkg.collections import Modules\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="collections"):
        need("shm_broken_pkg")
    with pytest.raises(pytest.skip.Exception, match="shm_absent_pkg is not installed"):
        need("shm_absent_pkg.sub")
    assert need("packaging.version").Version("1.0") == Version("1.0")
    call = "pytest.importorskip" + "("  # split: this file would find itself
    users = [p.name for p in (ROOT / "tests").glob("test_*.py") if call in p.read_text()]
    assert users == [], f"pytest.importorskip hides broken installs: use tests/_needs.need in {users}"
