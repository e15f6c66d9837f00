"""A LeRobot v3 dataset described for ``shmloader.Loader`` (``LeRobotSource``, made by ``dataset``):
its tables read once in the training process, its windows checked, its stretches grouped."""

from __future__ import annotations

import hashlib
import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from .._checks import check_choice, check_int, check_seconds
from .meta import load
from .read import EpisodeReader, Layout, SharedEpisodes, describe, tables
from ..engine.source import Spec
from ..video.media import is_remote
from ..video.reading import Reading

__all__ = ["LeRobotSource", "dataset"]

# Timesteps of an episode one worker decodes in one pass by default: with LeRobot's GOP of 2 a
# stretch costs at most one frame before it, and a batch of 32 draws from 8+ stretches (a window
# of 4 batches holds 8 groups).
_STRETCH = 16


class LeRobotSource:
    """A LeRobot v3 dataset described for ``shmloader.Loader`` and ``shmloader.ray.dataset``
    (made by :func:`dataset`; ``Dataset`` is its former name).

    ``cameras``: the video keys; ``fps``; ``tasks``: task texts by ``task_index``; ``episodes``:
    the ``episode_index`` of each chosen episode; ``left_out``: features not read (not numbers);
    ``skipped``: (``episode_index``, video file) of each episode left out for a missing video
    file (``on_error="skip"``), empty otherwise.
    ``read(samples)`` gives samples as one batch of arrays in this process, no loader running;
    ``reader()`` a reader that keeps its files open from one ``read`` to the next (a Ray task's).
    It pickles by value (its tables, no open file): a Ray task gets its own copy.
    """

    def __init__(self, root: str | os.PathLike[str], *, delta_timestamps: Mapping[str, Sequence[float]] | None,
                 episodes: Sequence[int] | None, tolerance_s: float, stretch: int, decoder: str,
                 decode_threads: int, storage_options: Mapping[str, Any] | None = None,
                 fetch: Mapping[str, Any] | None = None, on_error: str = "raise") -> None:
        check_int("stretch", stretch, 1)
        check_choice("on_error", on_error, ("raise", "skip"))
        check_seconds("tolerance_s", tolerance_s)
        reading = Reading(decoder=decoder, decode_threads=decode_threads, storage_options=storage_options,
                          fetch=fetch)
        remote = is_remote(os.fspath(root))
        if remote and decoder == "decord":
            raise ValueError("decoder='decord' reads local files only; a remote dataset's videos are read by "
                             "PyAV (decoder='auto' or 'pyav')")
        storage = reading.storage()
        meta = load(root, episodes, storage, on_missing=on_error)
        if meta.skipped:
            warnings.warn(meta.missing_note, stacklevel=3)  # the user's dataset() call
        self.skipped: list[tuple[int, str]] = list(meta.skipped)
        self.root, self.fps, self.cameras = meta.root, meta.fps, list(meta.cameras)
        self.tasks, self.left_out = meta.tasks, list(meta.left_out)
        self.episodes = meta.episodes["episode_index"].tolist()
        self.delta_timestamps = {k: [float(d) for d in v] for k, v in (delta_timestamps or {}).items()}
        self.tolerance_s, self.stretch = float(tolerance_s), stretch
        self.layout = Layout(root=meta.root, cameras=dict(meta.sizes), features=dict(meta.features),
                             deltas=_deltas(self.delta_timestamps, meta.fps, tolerance_s, meta),
                             tolerance_s=float(tolerance_s), decoder=decoder, decode_threads=decode_threads,
                             storage=storage, remote=remote)
        self._arrays = tables(meta.rows, meta.episodes, meta.episode_of_row)
        self._paths = meta.paths
        self._groups = _stretches(meta.episode_of_row, stretch)
        self._reader: EpisodeReader | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

    def __len__(self) -> int:
        return len(self._arrays["episode_of_row"])

    def __repr__(self) -> str:
        return (f"lerobot.dataset({self.root!r}: {len(self)} timesteps of {len(self.episodes)} episodes, "
                f"cameras {self.cameras}, {self.fps} fps)")

    def spec(self) -> Spec:
        return self.layout.spec()

    def describe(self, index: int) -> str:
        return describe(self.root, self._arrays, index)

    @property
    def group_size(self) -> int:
        """Samples the loader hands one worker to decode in one pass, on average (``group_ids``)."""
        return 1 if self._groups is None else -(-len(self) // (int(self._groups[-1]) + 1))

    def group_ids(self) -> np.ndarray | None:
        """Each sample's stretch (runs of ``stretch`` consecutive timesteps of an episode), or None
        with ``stretch=1``."""
        return self._groups

    def fingerprint(self) -> str:
        """A hash of the timesteps, episodes and windows, which a loader's saved state carries."""
        h = hashlib.sha256(self.root.encode("utf-8", "surrogateescape"))
        h.update(np.ascontiguousarray(self._arrays["row/index"]).tobytes())
        h.update(repr((sorted(self.layout.deltas.items()), self.stretch)).encode())
        return h.hexdigest()[:16]

    def for_workers(self) -> SharedEpisodes:
        """What one loader's workers run (the tables shared): the loader that asks owns it."""
        return SharedEpisodes(self.layout, self._arrays, list(self._paths))

    def reader(self) -> EpisodeReader:
        """A reader of these samples in this process: ``reader().read([0, 5, 9])`` gives their
        arrays as a loader's batch holds them, ``counters()`` its decodes so far (what a Ray task
        of ``shmloader.ray.dataset`` calls, as on ``VideoClips.reader()``)."""
        return EpisodeReader(self.layout, self._arrays, self._paths)

    def read(self, samples: Sequence[int]) -> dict[str, np.ndarray]:
        """Samples ``samples`` as one batch ``{field: [n, ...]}`` of new arrays, read here."""
        if self._reader is None:
            self._reader = self.reader()
        return self._reader.read(samples)


def dataset(root: str | os.PathLike[str], *, delta_timestamps: Mapping[str, Sequence[float]] | None = None,
            episodes: Sequence[int] | None = None, tolerance_s: float = 1e-4, stretch: int = _STRETCH,
            decoder: str = "auto", decode_threads: int = 1, storage_options: Mapping[str, Any] | None = None,
            fetch: Mapping[str, Any] | None = None, on_error: str = "raise") -> LeRobotSource:
    """The LeRobot v3 dataset at ``root`` as a source for ``shmloader.Loader`` (or
    ``shmloader.ray.dataset``).

    A remote ``root`` (``s3://bucket/prefix/ds``, ``hf://datasets/org/name``,
    ``https://host/ds``) is read where it lies: the metadata and the data's parquet files whole,
    once, in this process; the videos by byte range in the workers, a group's frames of every
    camera fetched together (NOTE [ Reading remote files ] in ``video.storage``), decoded by PyAV.
    The numbered parquet files are listed by the filesystem; over http(s), which lists nothing,
    ``meta/episodes``' files are tried in the writer's order (``chunk-000/file-000``,
    ``file-001``...) up to the first missing and their episodes checked against ``meta/info.json``'s
    ``total_episodes``, and the data files are those ``meta/episodes`` names.

    :param root: the dataset's folder (``meta/info.json``, ``data/``, ``videos/``), or its fsspec URL.
    :param delta_timestamps: key -> offsets in seconds (multiples of ``1 / fps`` within
        ``tolerance_s``), as LeRobot takes them: a camera's, ``action``'s or any numeric feature's
        window, with ``<key>_is_pad``.
    :param episodes: only these episodes (``episode_index``), as LeRobot's ``episodes=``.
    :param tolerance_s: how far from the time asked a frame may start (LeRobot's check); further
        is an error naming the file, the episode and the time (``Loader(on_error=)`` decides).
    :param stretch: consecutive timesteps of an episode grouped for one decode pass.
    :param decoder: ``"auto"`` (the probe's choice per file; PyAV for remote files), ``"pyav"`` or
        ``"decord"`` (local files only).
    :param decode_threads: decoding threads per worker.
    :param storage_options: as ``VideoClips``' (``shmloader.Reading.storage_options``): the fsspec
        filesystem's options (credentials, endpoint), or one dict per protocol.
    :param fetch: as ``VideoClips``' (``shmloader.Reading.fetch``): the workers' remote reads
        (``retries``, ``timeout``, ``block_size``, ``cache_bytes``, ``stat_ttl``).
    :param on_error: what a local video file the chosen episodes name but the folder lacks does:
        ``"raise"`` (a FileNotFoundError naming every such file, here), or ``"skip"`` (the
        episodes that use one are left out with one warning, and listed in ``.skipped``). A remote
        dataset's videos are not checked here: a missing one fails its samples in the workers
        (``Loader(on_error=)`` decides).
    :raises ValueError: not a v3 dataset, a bad argument, an offset off the frame rate.
    :raises FileNotFoundError: no ``meta/info.json`` or no ``meta/episodes`` or ``data`` file, or
        one they name missing (named, never with credentials); a local video file missing (every
        one named, with the episodes that use it), unless ``on_error="skip"`` leaves episodes to read.
    """
    return LeRobotSource(root, delta_timestamps=delta_timestamps, episodes=episodes, tolerance_s=tolerance_s,
                         stretch=stretch, decoder=decoder, decode_threads=decode_threads,
                         storage_options=storage_options, fetch=fetch, on_error=on_error)


# The class's first name, kept for code that imports it.
Dataset = LeRobotSource


def _deltas(delta_timestamps: dict[str, list[float]], fps: int, tolerance_s: float, meta) -> dict[str, tuple[int, ...]]:
    """Each key's offsets in rows (``round(d * fps)``, LeRobot's ``get_delta_indices``), the
    offsets checked as LeRobot's ``check_delta_timestamps`` checks them."""
    out = {}
    for k, offsets in delta_timestamps.items():
        if k not in meta.cameras and k not in meta.features:
            known = ", ".join([*meta.cameras, *meta.features])
            raise ValueError(f"delta_timestamps names {k!r}, which is not a camera or numeric feature ({known})")
        if not offsets:
            raise ValueError(f"delta_timestamps[{k!r}] is empty")
        off = [d for d in offsets if abs(d * fps - round(d * fps)) / fps > tolerance_s]
        if off:
            raise ValueError(f"delta_timestamps[{k!r}]: {off} are not multiples of 1/{fps} s within "
                             f"tolerance_s={tolerance_s}")
        out[k] = tuple(round(d * fps) for d in offsets)
    return out


def _stretches(episode_of_row: np.ndarray, stretch: int) -> np.ndarray | None:
    """Group ids: runs of at most ``stretch`` consecutive rows of one episode, numbered in order."""
    n = len(episode_of_row)
    if stretch == 1 or n == 0:
        return None
    starts = np.flatnonzero(np.concatenate([[True], episode_of_row[1:] != episode_of_row[:-1]]))
    run_start = np.repeat(starts, np.diff(np.concatenate([starts, [n]])))
    first = (np.arange(n) - run_start) % stretch == 0
    return (np.cumsum(first) - 1).astype(np.int64)
