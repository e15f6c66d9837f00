"""The package's types, as users' type checkers and editors see them (``py.typed``; mypy strict on
the modules of the public API, the default checks on the internals: see pyproject.toml)."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PUBLIC_API = Path(__file__).parent / "typing" / "public_api.py"
# numpy's stubs before 2.3 give ndarray no default type parameters (seen with 1.26 and 2.2): a bare
# ``np.ndarray`` is then ndarray[Any, Any], and an error where generics must be spelt out.
_BARE_NDARRAY = tuple(int(x) for x in np.__version__.split(".")[:2]) < (2, 3)


def mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


def test_the_package_type_checks():
    """``mypy`` (the configuration in pyproject.toml) finds nothing in shmloader/."""
    if _BARE_NDARRAY:  # the oldest lane, the lerobot lane
        pytest.skip(f"the package's annotations are checked against numpy >= 2.3's stubs (numpy "
                    f"{np.__version__}'s ndarray takes no default type parameters); users' own code is "
                    "checked below")
    r = mypy()
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert (ROOT / "shmloader" / "py.typed").exists()


def revealed(path: Path) -> tuple[dict[int, str], dict[int, str]]:
    """(line -> type mypy reveals, line -> type the ``# -> type`` comment expects)."""
    r = mypy(str(path))
    # Errors in the user's file only: mypy reports none in an installed package's modules (with
    # numpy 1.x's stubs it would here, reading shmloader/ from the checkout: see above).
    assert not re.search(rf"^{re.escape(str(path.relative_to(ROOT)))}:\d+: error", r.stdout, re.M), r.stdout
    got = {int(m[1]): m[2] for m in re.finditer(r":(\d+): note: Revealed type is \"(.*)\"", r.stdout)}
    wanted = {n: m[1].split("  (")[0] for n, line in enumerate(path.read_text().splitlines(), 1)
              if (m := re.search(r"reveal_type\(.*# -> (.*)$", line))}
    return got, wanted


def test_users_see_the_public_types():
    """Each ``reveal_type`` of the main calls in tests/typing/public_api.py (Loader, VideoClips,
    the batches, as_torch, as_keras, shmloader.jax, sampling) is the type its comment names."""
    got, wanted = revealed(PUBLIC_API)
    assert len(wanted) >= 18
    if _BARE_NDARRAY:  # the oldest lane's mypy 1.10 spells types its own way ("builtins.int",
        # "Union[X, None]"), and numpy 1.x's and 2.2's (the lerobot lane's) arrays are
        # ndarray[Any, Any]: the same types at the top, each named as it names them
        def head(t: str) -> str:
            return re.split(r"[\[( ]", t.replace("builtins.", ""), maxsplit=1)[0]

        got, wanted = ({n: head(t) for n, t in d.items()} for d in (got, wanted))
    assert got == wanted


def test_a_wrong_call_is_an_error(tmp_path):
    """The types catch mistakes: a misspelt keyword, a path list given as a string batch size."""
    user = tmp_path / "user.py"
    user.write_text("import shmloader\n"
                    "clips = shmloader.VideoClips(['a.mp4'], clip_length=8)\n"
                    "loader = shmloader.Loader(clips, batch_size='4')\n")
    r = mypy(str(user))
    assert r.returncode == 1
    assert 'Unexpected keyword argument "clip_length" for "VideoClips"' in r.stdout, r.stdout
    assert 'Argument "batch_size" to "Loader" has incompatible type "str"; expected "int | None"' in r.stdout, r.stdout
