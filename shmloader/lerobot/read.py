"""Reading LeRobot samples: rows in, arrays out, as ``LeRobotDataset.__getitem__`` builds them.

NOTE [ A LeRobot sample ]
Sample ``i`` is row ``i`` of the timestep table (``lerobot.meta``). A key ``k`` given offsets
``delta_timestamps[k]`` (seconds, multiples of ``1 / fps``) reads the rows at ``index + round(d *
fps)`` for each offset, clamped into the row's episode (``dataset_from_index .. dataset_to_index
- 1``), with ``k_is_pad`` True where the clamp moved it: the edge row repeats. A camera's frame for
a row is the one of its episode's file starting nearest to ``from_timestamp + timestamp`` of that
row (``video.stamps``), refused when further than ``tolerance_s`` (LeRobot's ``decode_video_frames``
check); a window of frames reads the clamped rows' timestamps, as LeRobot's
``_get_query_timestamps`` does.

A worker handed several samples (a stretch of an episode, grouped by the plan) reads every
camera's frames of all of them file by file: one decode pass over the union of each file's frames.
Remote files are probed together where not met yet, then the bytes of every camera's frames are
fetched in one round of requests (NOTE [ Reading remote files ] in ``video.storage``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..engine.shared import SharedStrings
from ..engine.source import Spec
from ..video.measuring import ChoiceLog, Cut, Measuring, measures
from ..video.segments import SharedSegments
from ..video.stamps import TimedFrames
from ..video.storage import LOCAL, Storage

__all__ = ["Layout", "EpisodeReader", "SharedEpisodes", "describe", "tables"]

# What the decoders are measured for (NOTE [ Measuring the decoder ]): a stretch of an episode's
# frames, found by their times, at the camera's own size.
_CUT = Cut("a stretch of an episode's frames by their times", 0, 0, 1)


@dataclass(frozen=True)
class Layout:
    """What a sample holds: the cameras (name -> (height, width)), the numeric features (name ->
    per-row shape, dtype), the offsets of each windowed key in rows, and how frames are found
    and read (``storage``; ``remote``: the videos are read through fsspec)."""

    root: str
    cameras: dict[str, tuple[int, int]]
    features: dict[str, tuple[tuple[int, ...], np.dtype]]
    deltas: dict[str, tuple[int, ...]]
    tolerance_s: float
    decoder: str = "auto"
    decode_threads: int = 1
    storage: Storage = field(default=LOCAL, repr=False, compare=False)
    remote: bool = False

    def spec(self) -> Spec:
        spec: Spec = {}
        for c, (h, w) in self.cameras.items():
            t = self.deltas.get(c)
            spec[c] = ((h, w, 3) if t is None else (len(t), h, w, 3), np.dtype(np.uint8))
        for k, (shape, dtype) in self.features.items():
            t = self.deltas.get(k)
            spec[k] = (shape if t is None else (len(t), *shape), dtype)
        for k, t in self.deltas.items():
            spec[f"{k}_is_pad"] = ((len(t),), np.dtype(np.bool_))
        return spec


def tables(rows: dict[str, np.ndarray], episodes: dict[str, np.ndarray], episode_of_row: np.ndarray
           ) -> dict[str, np.ndarray]:
    """The arrays a reader looks rows up in, by name: ``row/<feature>``, ``ep/<column>``, each
    row's episode, and the ``index`` column sorted (a window's rows found by their ``index``)."""
    index = rows["index"].astype(np.int64)
    order = np.argsort(index, kind="stable")
    return {**{f"row/{k}": a for k, a in rows.items()}, **{f"ep/{k}": a for k, a in episodes.items()},
            "episode_of_row": episode_of_row, "sorted_index": index[order], "sorted_rows": order.astype(np.int64)}


def describe(root: str, arrays: dict[str, np.ndarray], row: int) -> str:
    """What sample ``row`` is, for errors: the dataset, the episode and the frame in it."""
    return (f"{root!r}, episode {int(arrays['row/episode_index'][row])}, "
            f"frame {int(arrays['row/frame_index'][row]) if 'row/frame_index' in arrays else row}")


class _Pass(NamedTuple):
    """One camera's decode pass over one file: the samples it serves (positions in the batch),
    the file's frames each of them shows (``[n, T]``), their sorted union and each one's place
    in it."""

    camera: str
    path: str
    mine: np.ndarray
    frames: np.ndarray
    union: np.ndarray
    where: np.ndarray


class EpisodeReader:
    """Samples written into arrays in this process (NOTE [ A LeRobot sample ]): a loader's
    worker's (``SharedEpisodes``), or the reader of ``LeRobotSource.reader()`` (``read``,
    ``counters``: what a Ray task of ``shmloader.ray`` calls, as on a video reader).

    :param layout: what a sample holds.
    :param arrays: the tables (``tables``), numpy arrays or views of a shared segment.
    :param paths: the video files, indexable by the ``ep/<camera>/file`` numbers.
    :param choices: where the decoders measured per shape go for the loader to report.
    """

    def __init__(self, layout: Layout, arrays: dict[str, np.ndarray], paths: Sequence[str],
                 choices: ChoiceLog | None = None) -> None:
        self.layout, self.arrays, self.paths = layout, arrays, paths
        measured = measures(layout.decoder, layout.remote)  # NOTE [ Measuring the decoder ]
        self.frames = TimedFrames(layout.decode_threads, layout.decoder, layout.storage,
                                  Measuring(_CUT, choices) if measured else None)
        # As a video reader counts them (``Loader.stats``): frames the decoder went through from the
        # keyframes, those no sample shows, those before each pass's first, and frames delivered.

    def counters(self) -> dict[str, int]:
        return self.frames.counters()

    def read(self, samples: Sequence[int], *, seed: int = 0, epoch: int = 0) -> dict[str, np.ndarray]:
        """Samples ``samples`` (rows ``0 .. n - 1``) as one batch ``{field: [n, ...]}`` of new
        arrays. ``seed`` and ``epoch`` are a video reader's (``ClipReader.read``, what a Ray task
        calls): a LeRobot sample draws nothing, the same in every epoch."""
        ids = [int(s) for s in samples]
        n = len(self.arrays["episode_of_row"])
        for s in ids:
            if not 0 <= s < n:
                raise IndexError(f"sample {s} is not among the {n} samples")
        spec = self.layout.spec()
        batch = {k: np.zeros((len(ids), *shape), dtype) for k, (shape, dtype) in spec.items()}
        self.read_into(ids, [{k: a[i, ...] for k, a in batch.items()} for i in range(len(ids))])
        return batch

    def _rows(self, rows: np.ndarray, deltas: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``([n, T]`` rows a window of ``deltas`` reads for each of ``rows``, ``[n, T]`` pads)."""
        a = self.arrays
        index = a["row/index"][rows].astype(np.int64)[:, None] + np.asarray(deltas, np.int64)
        e = a["episode_of_row"][rows]
        lo, hi = a["ep/dataset_from_index"][e][:, None], a["ep/dataset_to_index"][e][:, None]
        pad = (index < lo) | (index >= hi)
        clamped = np.clip(index, lo, hi - 1)
        return a["sorted_rows"][np.searchsorted(a["sorted_index"], clamped)], pad

    def read_into(self, samples: list[int], outs: Sequence[dict[str, np.ndarray]]) -> None:
        """Write samples ``samples`` (rows) into ``outs``, every camera's file decoded once."""
        lay, a = self.layout, self.arrays
        rows = np.asarray(samples, np.int64)
        windows = {k: self._rows(rows, d) for k, d in lay.deltas.items()}
        for k in lay.features:
            col = a[f"row/{k}"]
            got = col[windows[k][0]] if k in windows else col[rows]
            for i, out in enumerate(outs):
                out[k][...] = got[i]
        for k, (_, pad) in windows.items():
            for i, out in enumerate(outs):
                out[f"{k}_is_pad"][...] = pad[i]
        e = a["episode_of_row"][rows]
        files = {c: a[f"ep/{c}/file"][e] for c in lay.cameras}
        if lay.remote:  # the files not met yet probed together, not one after another
            self.frames.probe_ahead([self.paths[int(f)] for c in lay.cameras for f in np.unique(files[c])])
        passes = [p for c in lay.cameras
                  for p in self._passes(c, rows, e, windows[c][0] if c in windows else rows[:, None], files[c])]
        if lay.remote:  # every camera's frames in one round of requests
            self.frames.prefetch([(p.path, p.union) for p in passes])
        for p in passes:
            self._fill(p, outs)

    def _passes(self, camera: str, rows: np.ndarray, e: np.ndarray, wanted: np.ndarray, files: np.ndarray
                ) -> list[_Pass]:
        """Camera ``camera``'s passes for the rows ``wanted`` (``[n, T]``) of samples ``rows``,
        whose episodes ``e`` keep it in ``files``: each frame found by its time, checked within
        ``tolerance_s``."""
        lay, a = self.layout, self.arrays
        stamps = a["row/timestamp"][wanted].astype(np.float64)
        seconds = a[f"ep/{camera}/from_timestamp"][e][:, None] + stamps
        out = []
        for f in np.unique(files):
            mine = np.flatnonzero(files == f)
            path = self.paths[int(f)]
            size = self.frames.size(path)
            if size != lay.cameras[camera]:
                raise ValueError(f"{lay.storage.name(path)!r}: frames of {size[0]}x{size[1]}, meta/info.json says "
                                 f"{camera!r} is {lay.cameras[camera][0]}x{lay.cameras[camera][1]}")
            frames, gaps = self.frames.nearest(path, seconds[mine])
            bad = np.argwhere(gaps >= lay.tolerance_s)
            if len(bad):
                s, t = bad[0]
                row = int(rows[mine[s]])
                raise ValueError(
                    f"{lay.storage.name(path)!r}: episode {int(a['row/episode_index'][row])}, {camera} at "
                    f"{seconds[mine[s], t]:.6f} s (from_timestamp {a[f'ep/{camera}/from_timestamp'][e[mine[s]]]:.6f} "
                    f"+ timestamp {stamps[mine[s], t]:.6f}): the nearest frame starts at "
                    f"{self.frames.starts(path)[frames[s, t]]:.6f} s, {gaps[s, t]:.6f} s away, not within "
                    f"tolerance_s={lay.tolerance_s}")
            union, where = np.unique(frames, return_inverse=True)
            out.append(_Pass(camera, path, mine, frames, union, where.reshape(frames.shape)))
        return out

    def _fill(self, p: _Pass, outs: Sequence[dict[str, np.ndarray]]) -> None:
        """Decode pass ``p`` and copy each sample's frames out."""
        decoded = self.frames.decode(p.path, p.union)
        windowed = p.camera in self.layout.deltas
        for j, s in enumerate(p.mine.tolist()):
            np.copyto(outs[s][p.camera], decoded[p.where[j]] if windowed else decoded[p.where[j, 0]])
        self.frames.decoding.count(p.union, self.frames.keyframes(p.path), p.frames.size)


class SharedEpisodes(SharedSegments):
    """The engine's source for a LeRobot dataset (``engine.source.Source``): its tables in one
    shared segment every worker maps (made when the loader starts, closed when its workers are
    gone), an ``EpisodeReader`` over them in each worker.

    :param layout: what a sample holds.
    :param arrays: the tables (``tables``).
    :param paths: the video files.
    """

    worker_imports = ("shmloader.video.preload",)  # for the fork server (engine.forkserver)

    def __init__(self, layout: Layout, arrays: dict[str, np.ndarray], paths: list[str]) -> None:
        super().__init__(measures(layout.decoder, layout.remote))
        self.layout, self._arrays, self._paths = layout, arrays, paths
        self._length = len(arrays["episode_of_row"])
        self._reader: EpisodeReader | None = None

    def __len__(self) -> int:
        return self._length

    def spec(self) -> Spec:
        return self.layout.spec()

    def describe(self, index: int) -> str:
        return describe(self.layout.root, self._arrays, index)

    def _make_table(self) -> SharedStrings:
        return SharedStrings(SharedStrings.encode(self._paths), self._arrays)

    def __getstate__(self) -> dict[str, Any]:
        """For the loader's workers: the layout, the segment's descriptor and the tables' names."""
        return {"layout": self.layout, "table": self._shared(), "names": list(self._arrays),
                "length": self._length, "choices": self._choices}

    def __setstate__(self, state: dict[str, Any]) -> None:
        table: SharedStrings = state["table"]
        self.layout, self._table, self._length = state["layout"], table, state["length"]
        self._arrays = {k: table.column(k) for k in state["names"]}
        self._paths = table  # type: ignore[assignment]  # indexable like the list
        self._reader, self._choices = None, state["choices"]

    def worker_init(self) -> None:
        self._reader = EpisodeReader(self.layout, self._arrays, self._paths, self._choices.log)

    def counters(self) -> dict[str, int]:
        return {} if self._reader is None else self._reader.counters()

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        self.read_many([index], [rng], [out])

    def read_many(self, indices: list[int], rngs: Sequence[np.random.Generator],
                  outs: Sequence[dict[str, np.ndarray]], epoch_key: Any = None) -> None:
        """Samples ``indices`` into ``outs`` (``EpisodeReader.read_into``: a file decoded once)."""
        assert self._reader is not None, "the reader is made in the workers (worker_init)"
        self._reader.read_into(indices, outs)
