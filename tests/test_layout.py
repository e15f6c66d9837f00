"""The package's layout: the import paths users write stay where they are, and each subpackage
imports only what its docstring allows (engine knows nothing of video; video sees only the
engine's contract for sources)."""

import ast
import importlib
import pathlib

import pytest

import shmloader

PACKAGE = pathlib.Path(shmloader.__file__).parent

# Every public import path and name, as the README and the docs use them. A move that drops or
# renames one fails here.
PUBLIC = {
    "shmloader": ["ArraySource", "Audio", "Calibration", "CalibrationRow", "FunctionSource", "HDF5Source", "Loader",
                  "LoaderError", "Pixels", "Reading", "SampleError", "Sampling", "StateError", "VideoClips",
                  "WorkerDiedError", "calibrate", "eval_loader", "prepare"],
    "shmloader.samples": ["frame_image", "make_videos", "read_codes", "write_video"],
    "shmloader.sampling": ["clip_frames", "crop_windows", "rate_frames", "scaled_size", "span_frames"],
    "shmloader.torch": ["TorchLoader", "as_torch"],
    "shmloader.jax": ["batches"],
    "shmloader.tfdata": ["LoaderCheckpoint", "as_dataset", "distributed_dataset"],
    "shmloader.ray": ["dataset", "plan_items", "prepare", "skipped", "stats"],
    "shmloader.lerobot": ["LeRobotSource", "dataset"],
    "shmloader.opensora": ["ASPECTS", "BucketReader", "BucketTable", "VideoBuckets", "aspect_sizes", "clips",
                           "from_table", "normalize", "pixels_of"],
    "shmloader.planned": ["Planned", "PlannedVideos", "Recipe", "Video"],
    "shmloader.qwen": ["MODELS", "Recipe", "VideoPlan", "clips", "frame_indices", "from_manifest", "frame_size", "grid_thw",
                       "normalize", "patches",
                       "plan", "sample_fps", "second_per_grid_ts"],
}

# What each part may import from the package (NOTE: the subpackages' docstrings say the same).
# every part's: the exceptions, the argument checks, modules imported on first use
_SHARED = {"shmloader._errors", "shmloader._checks", "shmloader._lazy"}
ALLOWED = {
    "engine": _SHARED | {"shmloader.engine"},
    "video": _SHARED | {"shmloader.video", "shmloader.engine.source", "shmloader.engine.shared",
                        "shmloader.engine.native_log", "shmloader.engine.skips"},
    "tools": _SHARED | {"shmloader._cpus", "shmloader.tools", "shmloader.video", "shmloader.engine.source",
                        "shmloader.engine.interrupts"},
    "ray": _SHARED | {"shmloader.ray", "shmloader.engine", "shmloader.video", "shmloader.tools"},
    "vlm": _SHARED | {"shmloader.vlm"},
    # the families: each its own folder over the house (the general parts and the planned
    # videos' house), never another family; nothing of the house imports a family
    "qwen": _SHARED | {"shmloader.qwen", "shmloader.vlm", "shmloader.video.planned", "shmloader.video.storage",
                       "shmloader.video.arguments"},
    "lerobot": _SHARED | {"shmloader.lerobot", "shmloader.engine.source", "shmloader.engine.shared", "shmloader.video"},
    "clips": _SHARED | {"shmloader.clips", "shmloader.engine.source", "shmloader.engine.shared", "shmloader.video"},
    "opensora": _SHARED | {"shmloader.opensora", "shmloader.engine.source", "shmloader.engine.shared",
                           "shmloader.engine.buckets", "shmloader.engine.skips", "shmloader.video"},
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_import_paths_hold_their_names(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in PUBLIC[module]:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def _is_module(name: str) -> bool:
    """Whether a string names a module of the package (a key that merely starts with its name does not)."""
    parts = name.split(".")
    if parts[0] != "shmloader" or len(parts) < 2:
        return False
    where = PACKAGE.joinpath(*parts[1:])
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _imports(path: pathlib.Path, package: str) -> set[str]:
    """The shmloader modules a file imports, resolved to absolute names (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("shmloader"):
                found |= {f"{target}.{a.name}" for a in node.names} if not node.module else {target}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("shmloader")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_module(node.value):
            found.add(node.value)  # -m shmloader.engine.worker, __import__("shmloader.tools.scan")
    return found


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_part_imports_only_what_it_may(part):
    folder = PACKAGE / part
    doc = importlib.import_module(f"shmloader.{part}").__doc__
    assert doc and "What it may import" in doc and "What lives here" in doc
    files = sorted(folder.glob("*.py"))
    assert len(files) > 3
    for path in files:
        package = f"shmloader.{part}"
        for target in _imports(path, package):
            assert any(target == a or target.startswith(a + ".") for a in ALLOWED[part]), \
                f"{path.relative_to(PACKAGE)} imports {target}"


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_each_package_docstring_lists_its_modules(part):
    """A package's docstring names every module it holds, so a newcomer finds the room for a thing
    (and a module added without a line there fails here)."""
    doc = importlib.import_module(f"shmloader.{part}").__doc__ or ""
    for path in sorted((PACKAGE / part).glob("[!_]*.py")) + sorted((PACKAGE / part).glob("_[!_]*.py")):
        assert f"``{path.stem}``" in doc, f"shmloader/{part}/__init__.py's docstring does not name {path.stem}"


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """The rule above can fail: a file of the engine importing the video part is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ..video.probe import probe\n")
    assert _imports(bad, "shmloader.engine") == {"shmloader.video.probe"}
    bad.write_text("from .. import VideoClips\n")
    assert _imports(bad, "shmloader.engine") == {"shmloader.VideoClips"}


def test_every_module_of_the_package_is_in_the_wheel_list():
    """pyproject lists the packages setuptools puts in the wheel: a subpackage missing there
    installs a broken shmloader (tests/test_wheel.py runs the installed one)."""
    from ._pyproject import pyproject

    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {"shmloader" + ("." + ".".join(p.parent.relative_to(PACKAGE).parts) if p.parent != PACKAGE else "")
               for p in PACKAGE.rglob("__init__.py")}
    assert listed == on_disk


# The house's proportions (one concept per module): a module past this many lines, or
# a class past this many, holds more than one concept.
_MODULE_LINES = 450
_CLASS_LINES = 300


def test_modules_and_classes_keep_the_house_proportions():
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = len(text.splitlines())
        assert lines <= _MODULE_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                assert size <= _CLASS_LINES, f"{path.relative_to(PACKAGE)}: class {node.name}, {size} lines"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (function-level and TYPE_CHECKING imports
    too); a package's ``__init__`` is left out (it re-exports the public names)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        if path.name == "__init__.py":
            continue
        package = name.rsplit(".", 1)[0]
        edges = set()
        for target in _imports(path, package):
            while target not in paths and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in paths and paths[target].name != "__init__.py" and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in ``graph`` (the modules along it, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_module_imports_itself_round_a_circle():
    """Every import of the package (at a function's start or for type checking included) goes
    one way: the seek evidence imports probe and decoders, the adapters reach the loader through
    a protocol, a video source makes its reader without the reader knowing the source."""
    circle = _circle(_graph())
    assert circle is None, " -> ".join(circle)


def test_the_circle_finder_finds_one():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


# One concept per function, as per module and per class above: a function past this many lines
# does more than one thing and is split where its concepts divide (named helpers, a small class).
_FUNCTION_LINES = 100


def test_no_function_is_over_100_lines():
    # Counted from the ``def`` line to the last line of the body, docstring included; decorators
    # are left out (ast's ``lineno`` of a function is its ``def``), as they are not its work.
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                assert size <= _FUNCTION_LINES, f"{path.relative_to(PACKAGE)}: {node.name}, {size} lines"


def _architecture_tree() -> set[str]:
    """The modules and folders the Architecture page's package tree names (``docs/architecture.md``,
    the block under "The package"), as paths under the package."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = text.split("## The package", 1)[1].split("```\nshmloader/\n", 1)[1].split("```", 1)[0]
    named, folders = set(), []
    for line in block.splitlines():
        marker = line.find("── ")
        if marker < 0:
            continue
        depth = (marker - 1) // 4
        name = line[marker + 3 :].split()[0]
        folders = folders[:depth]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        else:
            named.add("/".join([*folders, name]))
    return named


def test_the_architecture_page_names_every_module():
    """The page's package tree is the package's: every module on disk has its line, and no line
    names a module that is not there (a subpackage's ``__init__.py`` may go unnamed)."""
    on_disk = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    named = _architecture_tree()
    missing = sorted(m for m in on_disk - named if not m.endswith("/__init__.py"))
    assert not missing, f"docs/architecture.md's package tree lacks {missing}"
    assert not named - on_disk, f"docs/architecture.md's package tree names what is not there: {sorted(named - on_disk)}"
