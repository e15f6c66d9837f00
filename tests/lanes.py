"""The version lanes: the whole suite on another Python, in a venv of its own.

``make test`` runs on Python 3.11 with the exact versions of ``constraints.txt`` (the lab). Users
run the field: the newest Python with whatever pip picks today, or an old Python with the oldest
versions ``pyproject.toml`` allows. Each lane here builds ``.venv-<lane>-<python>`` once (again
when pyproject.toml or the lane's constraints change) and runs pytest in it:

    python tests/lanes.py newest 3.12 [pytest args]   # no constraints: the newest versions
    python tests/lanes.py oldest 3.10 [pytest args]   # every requirement at its declared minimum
    python tests/lanes.py lerobot 3.12 [pytest args]  # beside lerobot[dataset] 0.6 (its av 15)

``newest`` installs every extra, upgrading what is there; where pip cannot, an extra with no
release for that Python is left out with a line saying so (its tests skip) instead of failing the
lane. torch comes as users get it from PyPI, the CUDA build. ``oldest`` installs everything with
``constraints-oldest.txt``, which pins each requirement of pyproject.toml at its lower bound
(tests/test_lanes.py checks that the two agree). ``lerobot`` installs ``LEROBOT`` and shmloader
with every extra in one resolve, as a user adding shmloader to a LeRobot environment gets them:
lerobot's pins win (``av<16``, ``numpy<2.3``, ``torch<2.12``, from PyPI: the CUDA build), an extra
pip cannot install beside them is left out as in ``newest``, and ``pip check`` must find nothing
broken, else the lane fails before its tests.

The interpreter is ``$(pyenv root)/versions/<python>*/bin/python`` (the newest such), else
``python<python>`` on PATH.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLDEST = ROOT / "constraints-oldest.txt"
# Installed in this order, each on its own in the newest lane. `test` holds the test runner and the
# servers; the frameworks come as their own extras so that one without a wheel leaves the rest in.
EXTRAS = ("test", "samples", "hdf5", "omni", "lerobot", "opensora", "torch", "jax", "keras", "tf", "ray", "bench", "notebooks", "docs", "http", "s3", "gcs",
          "azure", "hf", "trainers")
# The lerobot lane: the LeRobot release whose pins shmloader must install beside (its dataset
# extra holds its video reading: av, torchcodec).
LEROBOT = "lerobot[dataset]==0.6.*"
LANES = ("newest", "oldest", "lerobot")


def interpreter(version: str) -> str:
    """The Python ``version`` (``3.12``) to build the lane's venv with."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python")),
                   key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()])
    if found:
        return found[-1]
    exe = shutil.which(f"python{version}")
    if exe is None:
        sys.exit(f"lanes: no Python {version} (pyenv install {version}, or put python{version} on PATH)")
    return exe


def pip(venv: Path, *args: str, check: bool = True) -> bool:
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    print("lanes:", " ".join(cmd[1:]), flush=True)
    done = subprocess.run(cmd, cwd=ROOT)
    if check and done.returncode:
        sys.exit(f"lanes: pip failed ({done.returncode}): {' '.join(args)}")
    return done.returncode == 0


def build(lane: str, version: str) -> Path:
    """The lane's venv, installed anew where pyproject.toml, the lane's constraints or the extras
    changed since (pip then only adds or changes what differs)."""
    venv = ROOT / f".venv-{lane}-{version}"
    inputs = [(ROOT / "pyproject.toml").read_bytes(), repr(EXTRAS).encode()]
    inputs += [OLDEST.read_bytes()] if lane == "oldest" else []
    inputs += [LEROBOT.encode()] if lane == "lerobot" else []
    key = hashlib.sha256(b"".join(inputs)).hexdigest()
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text().split("\n")[0] == key:
        print(f"lanes: {venv.name} is up to date", flush=True)
        print(stamp.read_text().split("\n", 1)[1], end="", flush=True)
        return venv
    if not (venv / "bin" / "python").exists():
        subprocess.run([interpreter(version), "-m", "venv", str(venv)], check=True)
    notes = []
    if lane == "oldest":
        pip(venv, "--upgrade", "pip")
        pip(venv, "-c", str(OLDEST), "-e", f".[{','.join(EXTRAS)}]")
    else:
        pip(venv, "--upgrade", "pip")
        # newest: also upgrade what a venv built before holds; lerobot: LeRobot's pins, resolved
        # with ours, as a user adding shmloader to a LeRobot environment gets them.
        lead = ("--upgrade", "--upgrade-strategy", "eager") if lane == "newest" else (LEROBOT,)
        if not pip(venv, *lead, "-e", f".[{','.join(EXTRAS)}]", check=False):
            # Some extra cannot be installed here (no release for this Python, or none within
            # LeRobot's pins): find which (each alone, without installing), then install the others
            # together (resolved together: one by one, an extra could upgrade what another one caps).
            dry = () if lane == "newest" else (LEROBOT,)
            fits = [e for e in EXTRAS if pip(venv, "--dry-run", *dry, "-e", f".[{e}]", check=False)]
            notes += [f"lanes: left out the [{e}] extra: pip cannot install it in the {lane} lane on Python "
                      f"{version} (its tests skip)\n" for e in EXTRAS if e not in fits]
            pip(venv, *lead, "-e", f".[{','.join(fits)}]")
    versions = subprocess.run([str(venv / "bin" / "python"), "-c", _VERSIONS], capture_output=True, text=True,
                              check=True).stdout
    summary = "".join(notes) + f"lanes: {venv.name}: {versions}\n"
    print(summary, end="", flush=True)
    stamp.write_text(key + "\n" + summary)
    return venv


def pip_check(venv: Path) -> str:
    """``pip check``'s verdict on the venv; the lane fails, naming what is broken, unless it is clean."""
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    said = (done.stdout + done.stderr).strip()
    if done.returncode:
        sys.exit(f"lanes: pip check found broken requirements in {venv.name}:\n{said}")
    return said


_VERSIONS = """
import platform
from importlib.metadata import version, PackageNotFoundError
names = ["numpy", "decord2", "av", "psutil", "fsspec", "torch", "jax", "keras", "tensorflow-cpu", "h5py", "lerobot"]
def v(n):
    try:
        return version(n)
    except PackageNotFoundError:
        return "-"
print("Python", platform.python_version() + ",", ", ".join(f"{n} {v(n)}" for n in names))
"""


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in LANES:
        print(__doc__, file=sys.stderr)
        return 2
    lane, version, rest = argv[0], argv[1], argv[2:]
    venv = build(lane, version)
    if lane == "lerobot":  # each run: a package installed by hand since the build may break it
        print(f"lanes: pip check: {pip_check(venv)}", flush=True)
    env = dict(os.environ, SHMLOADER_LANE=f"{lane}-{version}")  # tests that check the lab's pins skip
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", *rest], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
