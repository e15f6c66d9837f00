"""The editable install ``make`` makes: ``import shmloader`` finds the package from any folder, the
folder that holds the clone included (the clone is a folder named ``shmloader`` without an
``__init__.py``, which Python takes for a namespace package where nothing on ``sys.path`` holds a
regular one: setuptools' default editable finder is asked only after every folder of ``sys.path``).

The install is made here as the Makefile makes it (its editable mode), in a venv of its own that
sees this one's packages, without an index (``--offline --no-deps --no-build-isolation``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).parent / "uv"


def makefile_editable_mode() -> str | None:
    """The ``editable_mode`` the Makefile's install passes setuptools, if any."""
    found = re.findall(r"editable_mode=(\w+)", (ROOT / "Makefile").read_text())
    return found[0] if found else None


@pytest.mark.skipif(not UV.exists(), reason="the Makefile's install runs uv, which this venv lacks (a lane's)")
def test_the_editable_install_is_found_from_the_folder_that_holds_the_clone(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this venv's packages (setuptools for the build) as a path, its own .pth files not read
    shared = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(site, "_suite_packages.pth").write_text("".join(f"{p}\n" for p in sorted(shared)))
    mode = makefile_editable_mode()
    setting = ["--config-settings-package", f"shmloader:editable_mode={mode}"] if mode else []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    done = subprocess.run([str(UV), "pip", "install", "--quiet", "--offline", "--no-deps", "--no-build-isolation",
                           "--python", str(python), *setting, "-e", str(ROOT)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    holder = tmp_path / "src"  # a folder that holds a clone: ``shmloader/`` with no __init__.py at its top
    (holder / "shmloader" / "shmloader").mkdir(parents=True)
    (holder / "shmloader" / "README.md").write_text("a clone\n")
    ran = subprocess.run([str(python), "-c", "import shmloader; shmloader.Loader; print(shmloader.__file__)"],
                         cwd=holder, capture_output=True, text=True, timeout=120, env=env)
    assert ran.returncode == 0, f"editable_mode={mode}: {ran.stderr[-2000:]}"
    assert Path(ran.stdout.strip()) == ROOT / "shmloader" / "__init__.py"
