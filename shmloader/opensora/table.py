"""Open-Sora's data files read directly: a CSV or parquet table with a row per video, ``path``,
``text`` and the probe columns ``num_frames``, ``height``, ``width``, ``fps`` (what Open-Sora's
data tools write), so a million-video table is planned without opening a video."""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from .buckets import BucketTable
from .source import VideoBuckets, reading_of

__all__ = ["COLUMNS", "from_table"]

COLUMNS = ("path", "num_frames", "height", "width", "fps")  # ``text`` besides, where captions are


def _read(table: Any) -> dict[str, Any]:
    """The table's columns: a path to a ``.csv`` or ``.parquet`` file, or a mapping of columns (a
    dict or a pandas DataFrame)."""
    if isinstance(table, (str, os.PathLike)):
        path = os.fspath(table)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such table")
        try:
            import pyarrow.csv as pacsv  # type: ignore[import-untyped]  # no stubs
            import pyarrow.parquet as pq  # type: ignore[import-untyped]
        except ImportError as e:
            raise ImportError("opensora.from_table reads CSV and parquet with pyarrow: pip install pyarrow") from e
        if path.endswith(".parquet"):
            data = pq.read_table(path)
        elif path.endswith(".csv"):
            data = pacsv.read_csv(path)
        else:
            raise ValueError(f"{path}: a table is a .csv or .parquet file")
        return {name: data.column(name).to_numpy(zero_copy_only=False) for name in data.column_names}
    if hasattr(table, "columns") and hasattr(table, "__getitem__"):  # a DataFrame
        return {str(name): np.asarray(table[name]) for name in table.columns}
    if isinstance(table, Mapping):
        return {str(k): np.asarray(v) for k, v in table.items()}
    raise TypeError(f"table must be a .csv/.parquet path, a DataFrame or a dict of columns, got {type(table).__name__}")


def from_table(table: Any, *, bucket_config: Mapping[str, Mapping[int, Any]], root: str | os.PathLike[str] | None = None,
               fps_max: float = 16, decoder: str = "auto", decode_threads: int = 1,
               storage_options: Mapping[str, Any] | None = None, fetch: Mapping[str, Any] | None = None,
               allow_urls: bool = False, on_error: str = "raise") -> VideoBuckets:
    """``shmloader.opensora.clips`` over Open-Sora's data file ``table`` (``.csv``, ``.parquet``,
    a DataFrame or a dict of columns): ``path`` (relative ones under ``root``), ``text`` (the
    captions; optional), ``num_frames``, ``height``, ``width``, ``fps`` — the buckets planned from
    those columns without opening a video. A row whose columns are missing or not a video's is a
    video that cannot be read (``on_error``); a file that changed since is found by the worker
    that reads it."""
    columns = _read(table)
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"the table lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                         f"(it has {', '.join(sorted(columns))}): Open-Sora's data files carry "
                         f"{', '.join(COLUMNS)} and text")
    paths = [str(p) for p in columns["path"].tolist()]
    if root is not None:
        paths = [p if "://" in p or os.path.isabs(p) else os.path.join(os.fspath(root), p) for p in paths]
    metas = np.stack([np.asarray(columns[c], np.float64) for c in COLUMNS[1:]], axis=1) if paths else None
    captions = None if "text" not in columns else ["" if t is None else str(t) for t in columns["text"].tolist()]
    return VideoBuckets(paths, captions, BucketTable(bucket_config), fps_max=fps_max, on_error=on_error,
                        metas=metas, reading=reading_of(decoder, decode_threads, storage_options, fetch, allow_urls))
