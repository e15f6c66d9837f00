"""The package as users get it: the sdist and wheel ``make dist`` builds, their metadata (ranges, not
pins), one version everywhere, and the wheel installed into a fresh venv, away from this source tree,
running ``shmloader demo`` and ``shmloader scan``.

The fresh venv gets the wheel and nothing from this checkout. Its dependencies are not downloaded:
a folder of links to the distributions the wheel asks for (``Requires-Dist`` with the ``tf`` extra,
followed through their own requirements) in the environment running the suite is put on its path,
so pip, run with ``--no-index``, finds the wheel's requirements satisfied or fails, and a module the
package imports without declaring it is missing there. Nothing else of this environment is visible:
not the editable install of shmloader, not pytest, torch or jax.
"""

from __future__ import annotations

import csv
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import shmloader

from ._pyproject import pyproject
from .conftest import FRAMES, SIZE

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
# what the installed wheel must run with: `shmloader demo` streams through tf.data
WHEEL_EXTRAS = ("tf",)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and wheel of this checkout, built as ``make dist`` does but without build isolation
    (the build backend from this environment, so no download)."""
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def test_wheel_requirements_are_ranges_never_pins(dist):
    """``pip install shmloader[torch]`` must never downgrade a user's torch: no ``==`` (or ``===``) in
    any runtime requirement or extra. The suite's exact versions live in constraints.txt."""
    reqs = [Requirement(r) for r in wheel_metadata(dist["wheel"]).get_all("Requires-Dist")]
    assert reqs
    pinned = [str(r) for r in reqs for s in r.specifier if s.operator in ("==", "===")]
    assert pinned == [], f"pinned requirements in the wheel's metadata: {pinned}"
    assert not [str(r) for r in reqs if r.url], "a requirement by URL cannot be installed from PyPI"


def test_version_is_one_and_the_same_everywhere(dist):
    """``shmloader.__version__`` is the one place; the wheel, the sdist, the command line and the
    changelog's newest release say the same."""
    version = shmloader.__version__
    assert wheel_metadata(dist["wheel"])["Version"] == version
    assert dist["sdist"].name == f"shmloader-{version}.tar.gz"
    project = pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    r = subprocess.run([sys.executable, "-m", "shmloader", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"shmloader {version}", r
    releases = re.findall(r"^## \[(\d[^\]]*)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == version, f"CHANGELOG.md's newest release is {releases[:1]}, not {version}"


def test_sdist_and_wheel_pass_twine_check(dist):
    r = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(dist["wheel"]), str(dist["sdist"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_sdist_holds_what_the_suite_needs(dist):
    """From the sdist alone one can run the tests with the pinned versions: the tests and their
    helpers, constraints.txt, the Makefile and the changelog are in it."""
    import tarfile

    with tarfile.open(dist["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    want = {"tests/conftest.py", "tests/_variants.py", "tests/test_wheel.py", "constraints.txt", "Makefile",
            "CHANGELOG.md", "README.md", "shmloader/__init__.py"}
    assert want <= names, sorted(want - names)


def requirement_closure(requirements: list[Requirement], extras: tuple[str, ...] = ()) -> list[metadata.Distribution]:
    """The installed distributions that ``requirements`` (asked with ``extras``) need, transitively."""
    found: dict[str, metadata.Distribution] = {}
    asked: dict[str, set[str]] = {}  # the extras asked of each distribution so far
    todo = [(r, extras) for r in requirements]
    while todo:
        req, req_extras = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (*req_extras, "")):
            continue
        name = canonicalize_name(req.name)
        if name in found and set(req.extras) <= asked[name]:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req} is not installed in the suite's environment ({sys.prefix}): run make test")
        assert req.specifier.contains(dist.version, prereleases=True), f"{req} is installed as {dist.version}"
        found[name] = dist
        asked[name] = asked.get(name, set()) | set(req.extras)
        todo += [(Requirement(r), tuple(asked[name])) for r in dist.requires or ()]
    return list(found.values())


def link_distributions(dists: list[metadata.Distribution], folder: Path) -> None:
    """A site folder holding links to exactly the top-level files and folders of ``dists``."""
    folder.mkdir()
    for dist in dists:
        site = Path(dist.locate_file("")).resolve()
        assert site != ROOT, f"{dist.metadata['Name']} is installed from this source tree"
        tops = {Path(f).parts[0] for f in dist.files or () if Path(f).parts[0] not in ("..", "__pycache__")}
        for top in tops:
            if (site / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(site / top)


def fresh_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH (this checkout), no pip settings of the
    machine's (its indexes and wheel folders), no user site."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(PYTHONNOUSERSITE="1", PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (``shmloader[tf]``); returns its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("fresh")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    reqs = [Requirement(r) for r in wheel_metadata(dist["wheel"]).get_all("Requires-Dist")]
    deps = tmp / "deps"
    link_distributions(requirement_closure(reqs, WHEEL_EXTRAS), deps)
    py = venv / "bin" / "python"
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, env=fresh_env()).stdout.strip()
    (Path(purelib) / "_wheel_test_deps.pth").write_text(f"{deps}\n")
    wheel_req = f"shmloader[{','.join(WHEEL_EXTRAS)}] @ {dist['wheel'].as_uri()}"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "--quiet",
                        wheel_req], capture_output=True, text=True, timeout=180, env=fresh_env(), cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return venv / "bin"


def run_installed(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    r = subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, timeout=200,
                       env=fresh_env(), cwd=cwd)
    assert r.returncode == 0, f"{args}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r


def test_installed_wheel_imports_from_the_venv_not_the_tree(installed, tmp_path):
    r = run_installed(installed, "python", "-c", "import json, sys, shmloader; "
                      "print(json.dumps([shmloader.__file__, shmloader.__version__, sys.path]))", cwd=tmp_path)
    where, version, path = json.loads(r.stdout)
    assert Path(where).is_relative_to(installed.parent), where
    assert version == shmloader.__version__
    assert not [p for p in path if p and Path(p).resolve().is_relative_to(ROOT)], path
    assert run_installed(installed, "shmloader", "--version", cwd=tmp_path).stdout.strip() == f"shmloader {version}"


def test_installed_wheel_runs_the_demo(installed, tmp_path):
    """The console script pip made streams sample videos through tf.data with real workers (which
    start as ``python -P -m shmloader.engine.worker`` from the venv)."""
    r = run_installed(installed, "shmloader", "demo", "--videos", str(tmp_path / "v"), "--count", "2",
                      "--workers", "1", "--batches", "2", "--batch-size", "2", "--clip-len", "4",
                      "--size", "32x40", cwd=tmp_path)
    assert "through loader.as_dataset()" in r.stdout and "clips/s" in r.stdout, r.stdout


QUICKSTART = """
import numpy as np
import shmloader
from shmloader.samples import make_videos, read_codes

paths, labels = make_videos("videos", count=6)
clips = shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))
seen = []
with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, epochs=1) as loader:
    for batch in loader:
        ids, frames = read_codes(batch["video"])
        assert (ids == batch["index"][:, None]).all(), (ids, batch["index"])
        assert (frames == batch["frames"]).all(), (frames, batch["frames"])
        assert (batch["label"] == np.asarray(labels)[batch["index"]]).all()
        seen += batch["index"].tolist()
assert sorted(seen) == list(range(6)), seen
print("epoch exact:", len(seen), "clips")
"""


def test_installed_wheel_runs_the_quickstart_exactly(installed, tmp_path):
    """The README's quickstart in the fresh venv, one epoch with 2 workers: every video once, each
    clip's frames the ones its ``frames`` field names (the codes drawn into the sample videos)."""
    r = run_installed(installed, "python", "-c", QUICKSTART, cwd=tmp_path)
    assert "epoch exact: 6 clips" in r.stdout, r.stdout + r.stderr


def test_installed_wheel_is_typed(installed, tmp_path):
    """A user's type checker finds the installed wheel's types (``py.typed``): mypy, pointed at the
    fresh venv's interpreter from outside the tree, sees the signatures, not ``Any``."""
    user = tmp_path / "user.py"
    user.write_text("import shmloader\nreveal_type(shmloader.Loader(shmloader.VideoClips(['a.mp4']), batch_size=2))\n"
                    "shmloader.Loader(shmloader.VideoClips(['a.mp4']), batch_size='2')\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(installed / "python"),
                        "--no-incremental", str(user)], capture_output=True, text=True, timeout=300,
                       env=fresh_env(), cwd=tmp_path)
    assert 'Revealed type is "shmloader._loader.Loader"' in r.stdout, r.stdout + r.stderr
    assert 'Argument "batch_size" to "Loader" has incompatible type "str"' in r.stdout, r.stdout


def test_installed_wheel_scans_videos(installed, videos, tmp_path):
    """``shmloader scan`` of a class folder of real videos (and one file that is no video)."""
    paths, _ = videos
    for i, p in enumerate(paths[:4]):
        folder = tmp_path / "data" / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, folder / f"{i}.mp4")
    (tmp_path / "data" / "a" / "notes.mp4").write_text("not a video\n")
    run_installed(installed, "shmloader", "scan", "data", "--out", "manifest.csv", "--workers", "1", "--quiet",
                  cwd=tmp_path)
    with open(tmp_path / "manifest.csv", newline="") as f:
        rows = {Path(row["path"]).name: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["0.mp4", "1.mp4", "2.mp4", "3.mp4", "notes.mp4"]
    for name in ["0.mp4", "1.mp4", "2.mp4", "3.mp4"]:
        row = rows[name]
        assert (row["problem"], int(row["frames"]), int(row["height"]), int(row["width"])) == ("", FRAMES, *SIZE), row
    assert rows["notes.mp4"]["problem"], rows["notes.mp4"]


def test_constraints_pin_everything_the_suite_installs():
    """Every distribution the ``make test`` install pulls in has an exact pin in constraints.txt,
    torch as its CPU build, and the suite runs with those versions."""
    if os.environ.get("SHMLOADER_LANE"):
        pytest.skip(f"the {os.environ['SHMLOADER_LANE']} lane installs other versions than constraints.txt by design")
    makefile = (ROOT / "Makefile").read_text()
    (extras,) = re.findall(r"-e '\.\[([a-z0-9_,]+)\]'", makefile)
    assert "-c $(CONSTRAINTS)" in makefile and "CONSTRAINTS := constraints.txt" in makefile
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = spec.version
    assert pins["torch"].endswith("+cpu"), f"torch is pinned as {pins['torch']}, not the CPU build"
    project = pyproject()["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras.split(","):
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    unpinned, other = [], []
    for dist in requirement_closure(wanted):
        name = canonicalize_name(dist.metadata["Name"])
        if name not in pins:
            unpinned.append(name)
        elif pins[name] != dist.version:
            other.append(f"{name} {dist.version} (pinned {pins[name]})")
    assert unpinned == [], f"not pinned in constraints.txt: {unpinned}"
    assert other == [], f"the suite runs with other versions than constraints.txt pins: {other}"
