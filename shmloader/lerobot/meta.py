"""A LeRobot v3 folder read into numpy tables, once, in the main process.

What LeRobot 0.6 reads (``LeRobotDatasetMetadata``, ``load_nested_dataset``) and where:

- ``meta/info.json``: ``fps``, ``features`` (name -> dtype, shape, names; ``"video"`` for a
  camera), ``video_path`` (``videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4``);
- ``meta/episodes/chunk-*/file-*.parquet``: a row per episode: ``episode_index``,
  ``dataset_from_index`` / ``dataset_to_index`` (its timesteps' ``index`` values, end excluded),
  ``data/chunk_index`` / ``data/file_index``, and per camera ``videos/<key>/chunk_index``,
  ``file_index`` and ``from_timestamp`` (where the episode starts in that file);
- ``data/chunk-*/file-*.parquet``: a row per timestep, the numeric features as columns, read in
  the sorted order of the files' paths, filtered to the chosen episodes (a sample is a row);
- ``meta/tasks.parquet``: the tasks' texts, task ``i`` the ``i``-th row (``tasks.iloc[i]``).

A feature of shape ``(1,)`` is a scalar per row, as LeRobot's ``datasets.Value`` gives it.

The folder is local or at an fsspec URL (``s3://bucket/prefix/ds``, ``hf://datasets/org/name``,
``https://host/ds``), its files read whole through ``video.storage`` (retries, credentials kept
out of errors). The numbered parquet files are listed by the filesystem (``glob``); http(s) lists
nothing, so there ``meta/episodes`` files are tried in the order LeRobot's writer numbers them
(``file-000``, ``file-001``... of ``chunk-000``, then ``chunk-001`` after ``chunks_size`` files)
up to the first missing, the episodes found checked against ``total_episodes``; the data files
are those ``meta/episodes`` names.

The video files the chosen episodes name are checked when the folder is read: a local one that is
missing is named (with every other, at once) before any worker starts, or its episodes are left
out (``on_missing="skip"``). A remote folder's videos are not checked here (a request per file, or
a listing of a bucket's whole videos folder, before the first sample): a missing one fails its
samples in the workers, named there.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..video.media import has_scheme, is_remote, local_path, scheme_of
from ..video.storage import LOCAL, Storage, first_line

__all__ = ["Meta", "load"]

# The columns of meta/episodes a reader needs (the rest are statistics).
_EPISODE_COLUMNS = ("episode_index", "dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index")
_CAMERA_COLUMNS = ("chunk_index", "file_index", "from_timestamp")
_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_CHUNKS_SIZE = 1000  # files per chunk folder where info.json does not say (LeRobot's default)


@dataclass(frozen=True)
class Meta:
    """A v3 folder as tables: ``rows`` (feature -> ``[N, *shape]`` array, the timesteps of the
    chosen episodes in LeRobot's order), ``episodes`` (column -> ``[E]`` array, the chosen
    episodes; per camera ``<key>/file`` (into ``paths``) and ``<key>/from_timestamp``)."""

    root: str  # what errors name: the folder, or its URL without credentials
    fps: int
    cameras: tuple[str, ...]
    sizes: dict[str, tuple[int, int]]  # camera -> (height, width)
    features: dict[str, tuple[tuple[int, ...], np.dtype]]  # numeric feature -> per-row shape, dtype
    rows: dict[str, np.ndarray]
    episodes: dict[str, np.ndarray]
    episode_of_row: np.ndarray  # [N] the row's episode, a position in ``episodes``
    paths: list[str]
    tasks: list[str]
    left_out: tuple[str, ...]  # features that are not numbers or video (language, strings)
    # (episode_index, file) of each episode left out for a video file missing (on_missing="skip")
    skipped: tuple[tuple[int, str], ...] = ()
    missing_note: str = ""  # what was left out and why, one line (on_missing="skip"), else ""


class Folder:
    """The dataset's folder, local or at an fsspec URL: its files by path (joined with "/" on a
    URL), each read whole, the numbered ones listed (the module's docstring says how)."""

    def __init__(self, root: str | os.PathLike[str], storage: Storage = LOCAL) -> None:
        given = os.fspath(root)
        self.remote = is_remote(given)
        self.path = given.rstrip("/") if self.remote else os.path.abspath(local_path(given))
        self.storage = storage
        self.name = storage.name(self.path)
        self.lists = not self.remote or Storage.protocol(self.path) not in ("http", "https")

    def join(self, relative: str) -> str:
        return f"{self.path}/{relative}" if self.remote else os.path.join(self.path, relative)

    def read(self, path: str) -> bytes:
        """The whole file; FileNotFoundError naming it where it is missing."""
        if not self.remote:
            with open(path, "rb") as f:
                return f.read()
        return self.storage.call(path, "reading", lambda fs: fs.cat_file(path))

    def parquet(self, path: str):
        import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        data = self.read(path)
        try:
            return pq.read_table(pa.BufferReader(data))
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"{self.storage.name(path)!r} is not a readable parquet file: {first_line(e)}") from None

    def numbered(self, folder: str, pattern: str, chunks_size: int) -> list[str]:
        """The files ``folder/*/*.parquet`` in the sorted order of their paths: listed, or tried
        by their numbers (``pattern``) up to the first missing where the filesystem cannot list."""
        if not self.remote:
            return sorted(glob.glob(os.path.join(self.path, folder, "*", "*.parquet")))
        if self.lists:
            wanted, scheme = self.join(f"{folder}/*/*.parquet"), scheme_of(self.path)[0]
            found = self.storage.call(wanted, "listing", lambda fs: fs.glob(wanted))
            return sorted(f if has_scheme(f) else scheme + f for f in found)
        out: list[str] = []
        chunk = file = 0
        while True:
            path = self.join(pattern.format(chunk_index=chunk, file_index=file))
            try:
                self.storage.size(path)
            except FileNotFoundError:
                return out
            out.append(path)
            chunk, file = (chunk + 1, 0) if file + 1 >= chunks_size else (chunk, file + 1)


def load(root: str | os.PathLike[str], episodes: Sequence[int] | None = None, storage: Storage = LOCAL,
         on_missing: str = "raise") -> Meta:
    """The tables of the v3 dataset at ``root`` (a folder or an fsspec URL read through
    ``storage``); ``episodes``: only these (``episode_index``). A local video file the chosen
    episodes name that is missing: a FileNotFoundError naming them all (``on_missing="raise"``), or
    the episodes that use one left out (``on_missing="skip"``: ``Meta.skipped``, ``Meta.missing_note``)."""
    try:
        import pyarrow as pa
        import pyarrow.compute as pc  # type: ignore[import-untyped]
    except ImportError as e:
        raise ImportError("reading a LeRobot dataset's parquet tables needs pyarrow (pip install pyarrow; "
                          "lerobot[dataset] installs it)") from e

    folder = Folder(root, storage)
    root = folder.name
    info = _info(folder)
    fps = int(info["fps"])
    features: dict[str, dict[str, Any]] = info["features"]
    cameras = tuple(k for k, f in features.items() if f["dtype"] == "video")
    images = [k for k, f in features.items() if f["dtype"] == "image"]
    if images:
        raise ValueError(f"{root!r}: features stored as images ({', '.join(images)}) are not read yet; "
                         "only video cameras are")
    depth = [k for k in cameras if (features[k].get("info") or {}).get("is_depth_map")]
    if depth:
        raise ValueError(f"{root!r}: depth-map cameras ({', '.join(depth)}) are not read yet")
    numeric, left_out = {}, []
    for k, f in features.items():
        if f["dtype"] in ("video", "image"):
            continue
        try:
            dtype = np.dtype(f["dtype"])
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biuf":
            left_out.append(k)
            continue
        shape = tuple(int(s) for s in f["shape"])
        numeric[k] = (() if shape == (1,) else shape, dtype)
    for needed in ("index", "episode_index", "timestamp"):
        if needed not in numeric:
            raise ValueError(f"{root!r}: meta/info.json has no {needed!r} feature (is it a LeRobot v3 dataset?)")

    chunks_size = int(info.get("chunks_size") or _CHUNKS_SIZE)
    table = _parquets(folder, "meta/episodes", [*_EPISODE_COLUMNS, *(f"videos/{c}/{x}" for c in cameras
                                                                      for x in _CAMERA_COLUMNS)],
                      pattern=_EPISODES_PATH, chunks_size=chunks_size)
    if not folder.lists and "total_episodes" in info and table.num_rows != int(info["total_episodes"]):
        raise ValueError(f"{root!r}: meta/episodes/chunk-000/file-000.parquet onwards hold {table.num_rows} episodes, "
                         f"meta/info.json says {int(info['total_episodes'])} (a file missing from the numbering?)")
    if episodes is not None:
        wanted = np.asarray(sorted({int(e) for e in episodes}), np.int64)
        have = set(table.column("episode_index").to_pylist())
        missing = [int(e) for e in wanted if int(e) not in have]
        if missing:
            raise ValueError(f"{root!r} has no episode {missing[0]} (episode_index) among its {len(have)}")
        table = table.filter(pc.is_in(table.column("episode_index"), value_set=pa.array(wanted)))
    eps, paths = _videos(folder, info["video_path"], cameras, table)
    skipped: list[tuple[int, str]] = []
    note = ""
    gone = [] if folder.remote else [i for i, p in enumerate(paths) if not os.path.isfile(p)]
    if gone:
        bad, note = _missing(folder, paths, gone, eps, cameras)
        if bad.all():
            raise FileNotFoundError(note + ", every one: nothing is left to read")
        if on_missing == "raise":
            raise FileNotFoundError(note + "; lerobot.dataset(on_error='skip') leaves those episodes out")
        note += "; left out (on_error='skip'), listed in .skipped"
        gone_set = set(gone)
        for at in np.flatnonzero(bad).tolist():
            skipped.extend((int(eps["episode_index"][at]), storage.name(paths[int(eps[f"{c}/file"][at])]))
                           for c in cameras if int(eps[f"{c}/file"][at]) in gone_set)
        table = table.filter(pa.array(~bad))
        eps, paths = _videos(folder, info["video_path"], cameras, table)

    data_files = None if episodes is None and folder.lists and not skipped else sorted(
        {(int(a), int(b)) for a, b in zip(eps["data/chunk_index"], eps["data/file_index"])})
    data = _parquets(folder, "data", list(numeric), data_files, info.get("data_path") or _DATA_PATH, chunks_size)
    if episodes is not None or skipped:
        data = data.filter(pc.is_in(data.column("episode_index"), value_set=pa.array(eps["episode_index"])))
    rows = {k: _column(data.column(k), shape, dtype, k) for k, (shape, dtype) in numeric.items()}
    episode_of_row = _episodes_of_rows(root, rows, eps)
    return Meta(root=root, fps=fps, cameras=cameras, sizes={c: _size(c, features[c]) for c in cameras},
                features=numeric, rows=rows, episodes=eps, episode_of_row=episode_of_row, paths=paths,
                tasks=_tasks(folder), left_out=tuple(left_out), skipped=tuple(skipped), missing_note=note)


def _videos(folder: Folder, video_path: str, cameras: tuple[str, ...], table) -> tuple[dict[str, np.ndarray], list[str]]:
    """The episodes' columns a reader needs (``table``'s), per camera ``<key>/file`` (a position in
    the paths) and ``<key>/from_timestamp``; and the video files, each once, in the order met."""
    eps = {k: table.column(k).to_numpy() for k in _EPISODE_COLUMNS}
    paths: list[str] = []
    where: dict[str, int] = {}
    for c in cameras:
        files = []
        for chunk, file in zip(table.column(f"videos/{c}/chunk_index").to_pylist(),
                               table.column(f"videos/{c}/file_index").to_pylist()):
            path = folder.join(video_path.format(video_key=c, chunk_index=chunk, file_index=file))
            if path not in where:
                where[path] = len(paths)
                paths.append(path)
            files.append(where[path])
        eps[f"{c}/file"] = np.asarray(files, np.int64)
        eps[f"{c}/from_timestamp"] = table.column(f"videos/{c}/from_timestamp").to_numpy().astype(np.float64)
    return eps, paths


# Missing video files a message names; the rest are counted.
_FILES_NAMED = 4


def _missing(folder: Folder, paths: list[str], gone: list[int], eps: dict[str, np.ndarray],
             cameras: tuple[str, ...]) -> tuple[np.ndarray, str]:
    """Which of the episodes use one of the missing files ``gone`` (positions in ``paths``), and
    one line that names the files (the first few, each with its episodes) and counts the episodes
    and timesteps they hold."""
    gone_arr = np.asarray(gone, np.int64)
    bad = np.zeros(len(eps["episode_index"]), bool)
    users: dict[int, list[int]] = {g: [] for g in gone}
    for c in cameras:
        hit = np.isin(eps[f"{c}/file"], gone_arr)
        bad |= hit
        for k in np.flatnonzero(hit):
            users[int(eps[f"{c}/file"][k])].append(int(eps["episode_index"][k]))
    steps = eps["dataset_to_index"] - eps["dataset_from_index"]
    named = ", ".join(f"{_relative(folder, paths[g])} ({_episodes(users[g])})" for g in gone[:_FILES_NAMED])
    more = f", and {len(gone) - _FILES_NAMED} more" if len(gone) > _FILES_NAMED else ""
    files = f"{len(gone)} of the {len(paths)} video files the episodes name {'is' if len(gone) == 1 else 'are'} missing"
    note = (f"{folder.name!r}: {files}: {named}{more}; the episodes that use {'them' if len(gone) > 1 else 'it'}: "
            f"{int(bad.sum())} of {len(bad)} ({int(steps[bad].sum())} of {int(steps.sum())} timesteps)")
    return bad, note


def _relative(folder: Folder, path: str) -> str:
    """A file of the folder as messages that name the folder show it."""
    return os.path.relpath(path, folder.path) if not folder.remote else folder.storage.name(path)


def _episodes(numbers: list[int], most: int = 4) -> str:
    """``episode 3``, ``episodes 0-5, 9``: runs of consecutive numbers, the first ``most`` runs
    shown and the rest counted."""
    numbers = sorted(set(numbers))
    runs: list[list[int]] = []
    for e in numbers:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:most])
    rest = sum(b - a + 1 for a, b in runs[most:])
    return f"episode{'s' if len(numbers) > 1 else ''} {shown}" + (f" and {rest} more" if rest else "")


def _info(folder: Folder) -> dict[str, Any]:
    root = folder.name
    try:
        info = json.loads(folder.read(folder.join("meta/info.json")))
    except FileNotFoundError:
        raise FileNotFoundError(f"{root!r} is not a LeRobot dataset: it has no meta/info.json") from None
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise ValueError(f"{root!r} is a LeRobot {version or 'unversioned'} dataset; this reads v3.x (LeRobot "
                         "converts v2.1 with lerobot.scripts.convert_dataset_v21_to_v30)")
    return info


def _parquets(folder: Folder, sub: str, columns: list[str], files: list[tuple[int, int]] | None = None,
              pattern: str = _DATA_PATH, chunks_size: int = _CHUNKS_SIZE):
    """The parquet files ``sub/chunk-*/file-*.parquet`` (``Folder.numbered``; or only ``files``,
    (chunk, file) pairs placed by ``pattern``) read as one table of ``columns``, in the sorted
    order of their paths."""
    import pyarrow as pa

    if files is None:
        found = folder.numbered(sub, pattern, chunks_size)
    else:
        found = sorted(folder.join(pattern.format(chunk_index=c, file_index=f)) for c, f in files)
    if not found:
        raise FileNotFoundError(f"{folder.name!r} has no {sub}/chunk-*/file-*.parquet")
    tables = []
    for path in found:
        t = folder.parquet(path)
        absent = [c for c in columns if c not in t.column_names]
        if absent:
            raise ValueError(f"{folder.storage.name(path)!r} has no column {absent[0]!r}")
        tables.append(t.select(columns))
    return pa.concat_tables(tables).combine_chunks()


def _column(column, shape: tuple[int, ...], dtype: np.dtype, name: str) -> np.ndarray:
    """A parquet column of lists (of lists...) as a ``[rows, *shape]`` array of ``dtype``."""
    import pyarrow as pa

    n = len(column)
    if column.null_count:
        raise ValueError(f"the data's column {name!r} has {column.null_count} empty values")
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    while pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type) or \
            pa.types.is_large_list(values.type):
        values = values.flatten()
    flat = np.asarray(values.to_numpy(zero_copy_only=False))
    if flat.size != n * int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"the data's column {name!r} holds {flat.size} values for {n} rows of shape {shape}")
    return np.ascontiguousarray(flat.astype(dtype, copy=False).reshape((n, *shape)))


def _episodes_of_rows(root: str, rows: dict[str, np.ndarray], eps: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's episode (a position in ``eps``), every chosen episode checked to hold each of its
    timesteps ``dataset_from_index .. dataset_to_index - 1`` once (a window looks its rows up by them)."""
    position = {int(e): i for i, e in enumerate(eps["episode_index"])}
    try:
        of_row = np.fromiter((position[int(e)] for e in rows["episode_index"]), np.int64, len(rows["episode_index"]))
    except KeyError as e:
        raise ValueError(f"{root!r}: the data holds episode {e.args[0]}, which meta/episodes does not list") from None
    index = rows["index"].astype(np.int64)
    lo, hi = eps["dataset_from_index"][of_row], eps["dataset_to_index"][of_row]
    outside = np.flatnonzero((index < lo) | (index >= hi))
    if len(outside):
        r = int(outside[0])
        raise ValueError(f"{root!r}: row {r} (index {int(index[r])}) lies outside its episode "
                         f"{int(rows['episode_index'][r])}'s [{int(lo[r])}, {int(hi[r])}) in meta/episodes")
    counts = np.bincount(of_row, minlength=len(eps["episode_index"]))
    short = np.flatnonzero(counts != eps["dataset_to_index"] - eps["dataset_from_index"])
    if len(short) or len(np.unique(index)) != len(index):
        k = int(short[0]) if len(short) else 0
        raise ValueError(f"{root!r}: episode {int(eps['episode_index'][k])} has {int(counts[k])} rows in the data, "
                         f"meta/episodes says {int(eps['dataset_to_index'][k] - eps['dataset_from_index'][k])} "
                         "(or an index repeats)")
    return of_row


def _size(camera: str, feature: dict[str, Any]) -> tuple[int, int]:
    """(height, width) of a camera's frames: its video info, else its shape by its names."""
    info = feature.get("info") or {}
    if "video.height" in info and "video.width" in info:
        return int(info["video.height"]), int(info["video.width"])
    shape, names = [int(s) for s in feature["shape"]], list(feature.get("names") or [])
    if "height" in names and "width" in names:
        return shape[names.index("height")], shape[names.index("width")]
    if len(shape) == 3 and shape[-1] in (1, 3):
        return shape[0], shape[1]
    raise ValueError(f"camera {camera!r}: no height and width in meta/info.json ({feature})")


def _tasks(folder: Folder) -> list[str]:
    try:
        t = folder.parquet(folder.join("meta/tasks.parquet"))
    except FileNotFoundError:
        return []
    name = "task" if "task" in t.column_names else "__index_level_0__"
    return [str(s) for s in t.column(name).to_pylist()] if name in t.column_names else []
