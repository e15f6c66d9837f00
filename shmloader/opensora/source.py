"""Video-generation training samples in Open-Sora's buckets: the description (``VideoBuckets``),
what one loader's workers run (``SharedBucketVideos``) and a reader for any process.

Sample ``i`` of epoch ``e`` is video ``i`` in its bucket for that epoch (``buckets``' rules, drawn
from the loader's seed): ``T`` frames picked by ``linspace`` over a window of ``T × interval``
frames that starts at a seeded place, decoded at the size that fills the bucket's ``H × W``
(bilinear) and centre-cropped to it, as Open-Sora's dataset gives it — but only those frames are
decoded, at that size, never the whole video at full size.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping, Sequence

import numpy as np

from ..engine.buckets import BUCKET, Buckets
from ..engine.source import Spec, seeded
from ..video.measuring import Cut, measures
from ..video.probing import probe_rows
from ..video.reading import Reading
from ..video.segments import SharedDescription
from ..video.whole import WholeVideos, stacked
from .buckets import BucketTable, interval_for

__all__ = ["BucketReader", "SharedBucketVideos", "VideoBuckets", "fill_size", "frame_indices"]



def frame_indices(frames: int, length: int, interval: int, rng: np.random.Generator | None) -> np.ndarray:
    """Open-Sora's pick: ``length`` frames by ``linspace`` over a window of ``length × interval``
    frames (the video's end at most) whose start is uniform in ``[0, frames − window − 1]``
    (``rng=None``: the middle of that range, for evaluation)."""
    window = length * interval
    last = max(0, frames - window - 1)
    start = last // 2 if rng is None else int(rng.integers(0, last + 1))
    return np.linspace(start, min(start + window, frames) - 1, length).astype(np.int64)


def fill_size(height: int, width: int, target: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The size that covers ``target`` (height, width) keeping the aspect ratio, and where the
    centred crop of ``target`` starts in it (``resize_crop_to_fill``'s rule)."""
    th, tw = target
    rh, rw = th / height, tw / width
    if rh > rw:
        sh, sw = th, round(width * rh)
        return (sh, sw), (0, (sw - tw) // 2)
    sh, sw = round(height * rw), tw
    return (sh, sw), ((sh - th) // 2, 0)


class VideoBuckets(WholeVideos):
    """A bucketed source (NOTE [ Buckets ] in ``engine.buckets``) of videos in Open-Sora's buckets:
    ``video`` ``[B, T, H, W, 3]`` uint8, ``frames`` and ``times`` ``[B, T]`` (each frame's index
    and start in seconds), ``thw`` ``[B, 3]``, ``fps`` (the rate after the interval), ``bucket``,
    ``index`` (the video's position in the paths given), and ``caption`` (str, from the main
    process). Build it with ``shmloader.opensora.clips`` or ``from_table``."""

    worker_imports = ("shmloader.video.preload", "shmloader.opensora.source")  # for the fork server
    _cut = Cut("each video's frames at its bucket's size", 0, 0, 1)

    def __init__(self, paths: Sequence[str | os.PathLike[str]], captions: Sequence[str] | None, table: BucketTable,
                 *, fps_max: float, reading: Reading, on_error: str = "raise",
                 metas: np.ndarray | None = None, probes: str | os.PathLike[str] | None = None) -> None:
        given = self._open(paths, on_error)
        if captions is not None and len(captions) != len(given):
            raise ValueError(f"{len(captions)} captions for {len(given)} videos: one caption per video")
        if not fps_max > 0:
            raise ValueError(f"fps_max must be a positive rate, got {fps_max!r}")
        self.table, self.fps_max = table, float(fps_max)
        resolved = self._read(given, reading)
        self.captions = None if captions is None else [str(c) for c in captions]
        meta, reasons = _rows_of(metas, len(resolved)) if metas is not None else self._probed(resolved, probes)
        kept = self._keep(resolved, reasons, on_error, "read")
        meta = meta[kept]  # frames, height, width, fps
        self.counts, self.heights, self.widths = (meta[:, j].astype(np.int64) for j in range(3))
        self.rates = meta[:, 3].copy()
        self._digest = self._fingerprint()

    def _probed(self, paths: list[str], probes: str | os.PathLike[str] | None) -> tuple[np.ndarray, dict[int, str]]:
        """Every video probed here: its (frames, height, width, fps) row, or why it cannot be read.
        A file of one frame (an image: FFmpeg gives it a nominal 25 fps) is a still, of no rate,
        as Open-Sora's tables list images: a one-frame bucket takes it."""
        rows = probe_rows(paths, self.storage, kept=probes)
        meta = np.array([(np.nan,) * 4 if isinstance(r, str) else (r[0], r[2], r[3], np.nan if r[0] == 1 else r[1])
                         for r in rows], np.float64).reshape(-1, 4)
        return meta, {i: r for i, r in enumerate(rows) if isinstance(r, str)}

    def _fingerprint(self) -> str:
        h = hashlib.sha256("\0".join(self.paths).encode("utf-8", "surrogateescape"))
        for part in (self.positions, self.counts, self.heights, self.widths, self.rates,
                     self.table.shapes, self.table.batch_sizes):
            h.update(b";" + np.ascontiguousarray(part).tobytes())
        h.update(repr((self.fps_max, self.centred, [(ln.frames, ln.keep, ln.skip) for r in self.table.resolutions
                                      for ln in self.table.lengths[r]])).encode())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        left = f", {len(self.skipped)} left out" if self.skipped else ""
        return (f"{type(self).__name__}({len(self)} videos{left}, {len(self.table)} buckets, "
                f"fps_max={self.fps_max:g}, decoder={self.decoder!r})")

    # --------------------------------------------------------------- the source
    def spec(self) -> Spec:
        i64 = np.dtype(np.int64)
        return {"video": ((-1, 3), np.dtype(np.uint8)), "frames": ((-1,), i64), "times": ((-1,), np.dtype(np.float64)),
                "thw": ((3,), i64), "fps": ((), np.dtype(np.float32)), BUCKET: ((), i64), "index": ((), i64)}

    def buckets(self) -> Buckets:
        t, h, w = self.table.shapes.T
        lengths = self.table.shapes[:, :1]
        return Buckets(batch_sizes=self.table.batch_sizes, rows={"video": t * h * w, "frames": t, "times": t},
                       shapes={"video": self.table.shapes, "frames": lengths, "times": lengths},
                       names=self.table.names, assign=self.assign, pad=not self.centred)

    def assign(self, seed: int, epoch: int) -> np.ndarray:
        """Every sample's bucket in ``epoch`` under ``seed`` (``-1``: none holds it)."""
        return self.table.assign(self.counts, self.heights, self.widths, self.rates, seed=seed, epoch=epoch,
                                 fps_max=self.fps_max, ids=self.positions)

    def left_out(self, seed: int, epoch: int) -> list[tuple[int, str]]:
        """The videos no bucket holds in ``epoch`` under ``seed``: (position in the paths given,
        path), as ``stats()["left_out"]`` counts them."""
        return [(int(self.positions[i]), self.describe(i)) for i in np.flatnonzero(self.assign(seed, epoch) < 0).tolist()]

    def for_eval(self) -> VideoBuckets:
        """This dataset as ``eval_loader`` reads it: every video once, in the largest bucket that
        holds it (each length kept with certainty, no skipping), its frames from the middle of the
        window's range rather than a seeded place; a bucket's last batch short, not padded."""
        copy = VideoBuckets.__new__(VideoBuckets)
        copy.__dict__.update(self.__dict__)
        copy.table, copy.centred = self.table.certain(), True
        copy._digest = copy._fingerprint()
        return copy

    centred = False  # frames from the middle of the window's range (for_eval)

    def extras(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """What a batch carries from the main process: ``caption`` of each of its videos."""
        caption = np.empty(len(index), dtype=object)
        caption[:] = [""] * len(index) if self.captions is None else [self.captions[int(i)] for i in index]
        return {"caption": caption}

    def reader(self) -> BucketReader:
        return BucketReader(self)

    def for_workers(self) -> SharedBucketVideos:
        return SharedBucketVideos(self)

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        decoding = self._worker_decoding()
        length, height, width = (int(x) for x in self.table.shapes[int(out[BUCKET])])
        info = decoding.info(self.paths[index])
        rate = float(self.rates[index])
        interval = interval_for(rate, self.fps_max)
        if info.frames < length * interval:
            raise ValueError(f"the video has {info.frames} frames, its bucket needs {length} x {interval}: it "
                             "changed since its frame count was read")
        picked = frame_indices(info.frames, length, interval, None if self.centred else rng)
        size, (top, left) = fill_size(info.height, info.width, (height, width))
        union, where = np.unique(picked, return_inverse=True)
        if self.remote:
            decoding.prefetch([(info, union, None)])
        decoded = decoding.decode(info, size, union)
        decoding.count(union, decoding.keyframes(info), length)
        decoding.close_file(info.path)  # read once an epoch: its decoder's frames need not stay
        video = out["video"].reshape(length, height, width, 3)
        crop = decoded[:, top : top + height, left : left + width]
        np.copyto(video, crop if len(union) == length else crop[where.reshape(-1)])
        out["frames"][:] = picked
        times = info.times()
        out["times"][:] = np.nan if times is None else times[picked, 0] - times[0, 0]
        out["thw"][:] = (length, height, width)
        out["fps"][...] = rate if interval == 1 else np.floor(rate / interval)
        out["index"][...] = self.positions[index]


class SharedBucketVideos(SharedDescription):
    """The engine's source for ``VideoBuckets``: the paths and per-video columns in one shared
    segment every worker maps, so a worker's memory does not grow with the videos."""

    _COLUMNS = ("positions", "rates")
    _MAIN_ONLY = ("paths", "captions", "skipped", "counts", "heights", "widths")

    def __init__(self, videos: VideoBuckets) -> None:
        super().__init__(videos, measures(videos.decoder, videos.remote))


class BucketReader:
    """``read(samples, seed=, epoch=)`` in any process: each sample in its bucket for that epoch
    and seed (as a loader with that seed reads it), fields of rows as object arrays of each
    sample's own (``video`` ``[T, H, W, 3]``); a sample no bucket holds that epoch is refused."""

    def __init__(self, videos: VideoBuckets) -> None:
        self.clips = videos
        self._assigned: tuple[int, int, np.ndarray] | None = None  # the last (seed, epoch)'s buckets

    def read(self, samples: Sequence[int], *, seed: int = 0, epoch: int = 0) -> dict[str, np.ndarray]:
        vc, spec = self.clips, self.clips.spec()
        buckets = vc.buckets()
        if self._assigned is None or self._assigned[:2] != (seed, epoch):  # a task's samples share them
            self._assigned = (seed, epoch, vc.assign(seed, epoch))
        ids = self._assigned[2]
        outs = []
        for s in (int(s) for s in samples):
            if not 0 <= s < len(vc):
                raise IndexError(f"sample {s} is not among the {len(vc)} samples")
            k = int(ids[s])
            if k < 0:
                raise ValueError(f"sample {s} ({vc.describe(s)}) fits no bucket in epoch {epoch}")
            out = {name: np.zeros((int(buckets.rows[name][k]), *shape[1:]) if shape[:1] == (-1,) else shape, dtype)
                   for name, (shape, dtype) in spec.items()}
            out[BUCKET][...] = k
            vc.read(s, seeded((seed, epoch, s)), out)
            out["video"] = out["video"].reshape(*buckets.shapes["video"][k].tolist(), 3)
            outs.append(out)
        batch = stacked(outs, spec)
        batch.update(vc.extras(batch["index"]))
        return batch

    def counters(self) -> dict[str, int]:
        return self.clips.counters()


def _rows_of(metas: np.ndarray, count: int) -> tuple[np.ndarray, dict[int, str]]:
    """A table's (frames, height, width, fps) rows, and why a row cannot be planned, by row."""
    meta = np.asarray(metas, np.float64)
    if meta.shape != (count, 4):
        raise ValueError(f"metas must be {count} rows of (num_frames, height, width, fps), got shape {meta.shape}")
    ok = np.isfinite(meta[:, :3]).all(axis=1) & (meta[:, :3] >= 1).all(axis=1)
    return meta, {i: f"the table gives it {f} frames of {h}x{w}: not a video"
                  for i, (f, h, w, _) in zip(np.flatnonzero(~ok).tolist(), meta[~ok].tolist())}


def reading_of(decoder: str, decode_threads: int, storage_options: Mapping[str, Any] | None,
               fetch: Mapping[str, Any] | None, allow_urls: bool) -> Reading:
    return Reading(decoder=decoder, decode_threads=decode_threads, storage_options=storage_options, fetch=fetch,
                   allow_urls=allow_urls)
