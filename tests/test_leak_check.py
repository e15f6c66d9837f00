"""The leak check itself: it finds our segments by what they are, and a leak on purpose is caught."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shmloader

from .conftest import leaks, live_children, our_fds, our_mappings, shm_entries

pytestmark = pytest.mark.timeout(60)


def baseline():
    return shm_entries(), {p.pid for p in live_children()}


def pick_shm_dir(where, request):
    """None for a memfd ring, the `shm_dir` fixture's directory, or the path given."""
    if where == "fixture":
        return request.getfixturevalue("shm_dir")
    return None if where == "memfd" else where


def test_a_clone_folder_named_shmloader_is_not_a_leak(tmp_path):
    """A font under ``shmloader/.venv`` is an open file whose path contains "shmloader": not ours."""
    font = tmp_path / "shmloader" / ".venv" / "lib" / "DejaVuSans.ttf"
    font.parent.mkdir(parents=True)
    font.write_bytes(b"\0" * 4096)
    before = baseline()
    with open(font, "rb"):
        assert our_fds() == [] and leaks(*before, wait_s=0) == []


def test_leaked_memfd_is_caught():
    before = baseline()
    fd = os.memfd_create("shmloader", os.MFD_CLOEXEC)
    try:
        assert our_fds() == ["/memfd:shmloader (deleted)"]
        assert any("memfd:shmloader" in f for f in leaks(*before, wait_s=0))
    finally:
        os.close(fd)
    assert leaks(*before, wait_s=0) == []


def test_tmpfiles_elsewhere_are_not_ours(tmp_path):
    before = baseline()
    try:
        fd = os.open(tmp_path, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        pytest.skip(f"{tmp_path} does not support O_TMPFILE: {e}")
    try:
        assert our_fds() == [] and leaks(*before, wait_s=0) == []
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["/dev/shm", "fixture"])
def test_leaked_tmpfile_in_shm_dir_is_caught(where, request):
    shm_dir = pick_shm_dir(where, request)
    before = baseline()
    try:
        fd = os.open(shm_dir, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as e:
        pytest.skip(f"{shm_dir} does not support O_TMPFILE: {e}")
    try:
        found = our_fds()
        assert len(found) == 1 and found[0].startswith(f"{shm_dir}/#") and found[0].endswith(" (deleted)")
        assert leaks(*before, wait_s=0) == [f"shmloader descriptors left open: {found}"]
    finally:
        os.close(fd)
    assert leaks(*before, wait_s=0) == []


@pytest.mark.parametrize("where", ["memfd", "/dev/shm", "fixture"])
def test_a_loader_left_open_is_caught(where, request):
    shm_dir = pick_shm_dir(where, request)
    before = baseline()
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.int64(i)}, {"x": ((), np.int64)}, 8)
    loader = shmloader.Loader(src, batch_size=2, workers=1, shm_dir=shm_dir)
    try:
        batch = next(iter(loader))
        assert len(our_mappings()) == 1  # the ring, mapped once, whichever kind it is
        found = leaks(*before, wait_s=0)
        assert any("processes left behind" in f for f in found)
        assert any("descriptors left open" in f for f in found)
    finally:
        loader.close()
        del batch
    assert leaks(*before) == [] and our_mappings() == []


@pytest.mark.parametrize("name", ["psm_{}", "shmloader_{}"])
def test_a_named_segment_left_in_dev_shm_is_caught(name):
    """What multiprocessing.shared_memory (psm_*) or a segment named after us would leave."""
    before = baseline()
    path = f"/dev/shm/{name.format(os.getpid())}"
    with open(path, "wb"):
        pass
    try:
        assert any(os.path.basename(path) in f for f in leaks(*before, wait_s=0))
    finally:
        os.unlink(path)
    assert leaks(*before, wait_s=0) == []


def test_other_programs_entries_in_dev_shm_are_not_ours():
    before = baseline()
    path = f"/dev/shm/torch_{os.getpid()}_0_0"  # what a torch DataLoader on the same machine leaves
    with open(path, "wb"):
        pass
    try:
        assert leaks(*before, wait_s=0) == []
    finally:
        os.unlink(path)


def test_the_autouse_check_fails_a_leaking_test(tmp_path):
    """Run the suite's own conftest on a test that leaks a memfd: pytest must report the leak."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_leaky.py").write_text(
        "import os\n\n\ndef test_leaks():\n    test_leaks.fd = os.memfd_create('shmloader')\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                          str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 passed, 1 error" in out.stdout and "descriptors left open" in out.stdout, out.stdout
