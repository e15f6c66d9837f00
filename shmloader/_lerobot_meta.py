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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["Meta", "load"]

# The columns of meta/episodes a reader needs (the rest are statistics).
_EPISODE_COLUMNS = ("episode_index", "dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index")
_CAMERA_COLUMNS = ("chunk_index", "file_index", "from_timestamp")


@dataclass(frozen=True)
class Meta:
    """A v3 folder as tables: ``rows`` (feature -> ``[N, *shape]`` array, the timesteps of the
    chosen episodes in LeRobot's order), ``episodes`` (column -> ``[E]`` array, the chosen
    episodes; per camera ``<key>/file`` (into ``paths``) and ``<key>/from_timestamp``)."""

    root: str
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


def load(root: str | os.PathLike[str], episodes: Sequence[int] | None = None) -> Meta:
    """The tables of the v3 dataset at ``root``; ``episodes``: only these (``episode_index``)."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
        import pyarrow.compute as pc  # type: ignore[import-untyped]
    except ImportError as e:
        raise ImportError("reading a LeRobot dataset's parquet tables needs pyarrow (pip install pyarrow; "
                          "lerobot[dataset] installs it)") from e

    root = os.path.abspath(os.fspath(root))
    info = _info(root)
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

    table = _parquets(root, "meta/episodes", [*_EPISODE_COLUMNS, *(f"videos/{c}/{x}" for c in cameras
                                                                    for x in _CAMERA_COLUMNS)])
    if episodes is not None:
        wanted = np.asarray(sorted({int(e) for e in episodes}), np.int64)
        have = set(table.column("episode_index").to_pylist())
        missing = [int(e) for e in wanted if int(e) not in have]
        if missing:
            raise ValueError(f"{root!r} has no episode {missing[0]} (episode_index) among its {len(have)}")
        table = table.filter(pc.is_in(table.column("episode_index"), value_set=pa.array(wanted)))
    eps = {k: table.column(k).to_numpy() for k in _EPISODE_COLUMNS}
    paths: list[str] = []
    where: dict[str, int] = {}
    for c in cameras:
        files = []
        for chunk, file in zip(table.column(f"videos/{c}/chunk_index").to_pylist(),
                               table.column(f"videos/{c}/file_index").to_pylist()):
            path = os.path.join(root, info["video_path"].format(video_key=c, chunk_index=chunk, file_index=file))
            if path not in where:
                where[path] = len(paths)
                paths.append(path)
            files.append(where[path])
        eps[f"{c}/file"] = np.asarray(files, np.int64)
        eps[f"{c}/from_timestamp"] = table.column(f"videos/{c}/from_timestamp").to_numpy().astype(np.float64)

    data_files = None if episodes is None else sorted(
        {(int(a), int(b)) for a, b in zip(eps["data/chunk_index"], eps["data/file_index"])})
    data = _parquets(root, "data", list(numeric), data_files, info.get("data_path"))
    if episodes is not None:
        data = data.filter(pc.is_in(data.column("episode_index"), value_set=pa.array(eps["episode_index"])))
    rows = {k: _column(data.column(k), shape, dtype, k) for k, (shape, dtype) in numeric.items()}
    episode_of_row = _episodes_of_rows(root, rows, eps)
    return Meta(root=root, fps=fps, cameras=cameras, sizes={c: _size(c, features[c]) for c in cameras},
                features=numeric, rows=rows, episodes=eps, episode_of_row=episode_of_row, paths=paths,
                tasks=_tasks(root), left_out=tuple(left_out))


def _info(root: str) -> dict[str, Any]:
    path = os.path.join(root, "meta", "info.json")
    try:
        with open(path) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{root!r} is not a LeRobot dataset: it has no meta/info.json") from None
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise ValueError(f"{root!r} is a LeRobot {version or 'unversioned'} dataset; this reads v3.x (LeRobot "
                         "converts v2.1 with lerobot.scripts.convert_dataset_v21_to_v30)")
    return info


def _parquets(root: str, folder: str, columns: list[str], files: list[tuple[int, int]] | None = None,
              pattern: str | None = None):
    """The parquet files ``folder/chunk-*/file-*.parquet`` (or only ``files``, (chunk, file) pairs
    placed by ``pattern``) read as one table of ``columns``, in the sorted order of their paths."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    if files is None:
        found = sorted(glob.glob(os.path.join(root, folder, "*", "*.parquet")))
    else:
        found = sorted(os.path.join(root, (pattern or "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet")
                                    .format(chunk_index=c, file_index=f)) for c, f in files)
    if not found:
        raise FileNotFoundError(f"{root!r} has no {folder}/chunk-*/file-*.parquet")
    tables = []
    for path in found:
        t = pq.read_table(path)
        absent = [c for c in columns if c not in t.column_names]
        if absent:
            raise ValueError(f"{path!r} has no column {absent[0]!r}")
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


def _tasks(root: str) -> list[str]:
    import pyarrow.parquet as pq

    path = os.path.join(root, "meta", "tasks.parquet")
    if not os.path.exists(path):
        return []
    t = pq.read_table(path)
    name = "task" if "task" in t.column_names else "__index_level_0__"
    return [str(s) for s in t.column(name).to_pylist()] if name in t.column_names else []
