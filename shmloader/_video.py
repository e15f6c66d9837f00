"""VideoClips: clips of ``clip_len`` frames decoded by decord inside the workers.

decord is imported here alone, lazily: in the workers, and in the main process only when
``size=None`` asks for the native size (one frame of the first video is read to learn it).
"""

from __future__ import annotations

import ctypes
import os
import re
from collections import OrderedDict
from typing import Sequence

import numpy as np

from ._source import Spec, check_int

__all__ = ["VideoClips"]

_SAMPLINGS = ("random", "uniform", "center")

# decord cannot scale to these output widths: get_batch fails with "DECORDArrayCopyFromTo: The
# size must exactly match" (measured with decord2 3.4.0 on H.264 and MPEG-4, any height and
# any source size). For them the worker decodes at a multiple of the width and averages
# columns back down. Any other width that still fails is added at run time (see _Decoder).
_BAD_WIDTHS = frozenset({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96, 144})

# Readers kept open per worker after their clip is read. None: decord's reader keeps decoding
# ahead in its own thread while it sits idle, so a cache of 4 cost ~50 % more CPU per clip
# (1 worker at 146 % of a core instead of 103 %) for no gain in wall time (measured on the
# demo videos, 16x112x112 random clips). Opening a reader is cheaper than feeding idle ones.
_READER_CACHE = 0

_VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg")

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:")


def _decode_width(width: int, bad: frozenset[int] | set[int] = _BAD_WIDTHS) -> int:
    k = 1
    while width * k in bad:
        k += 1
    return width * k


class VideoClips:
    """Clips from video files, decoded in the workers.

    Each sample: ``video`` uint8 ``[clip_len, H, W, 3]``, ``label`` int64 (-1 without labels),
    ``index`` int64 (the video's position in ``paths``), ``start`` int64 (first frame; the clip
    is frames ``start + k * frame_step``). There are ``len(paths) * clips_per_video`` samples.

    ``sampling``: ``"random"`` start per clip, new each epoch; ``"uniform"`` clips spread evenly
    over the video; ``"center"`` the middle of the video. A video shorter than one clip
    (``(clip_len - 1) * frame_step + 1`` frames) is an error for that sample (a ``SampleError``,
    or a skip with ``on_error="skip"``). ``size=(height, width)`` resizes while decoding; with
    ``None`` every video must have the size of the first one. Paths are local files: URLs and
    FFmpeg protocol strings (``http:``, ``concat:``...) are refused unless ``allow_urls=True``.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None, *,
                 clip_len: int = 16, frame_step: int = 1, clips_per_video: int = 1,
                 sampling: str = "random", size: tuple[int, int] | None = None,
                 allow_urls: bool = False, decode_threads: int = 1) -> None:
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise ValueError("paths is empty")
        for name, v in (("clip_len", clip_len), ("frame_step", frame_step),
                        ("clips_per_video", clips_per_video)):
            check_int(name, v, 1)
        if sampling not in _SAMPLINGS:
            raise ValueError(f"sampling must be one of {_SAMPLINGS}, got {sampling!r}")
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != (len(paths),):
                raise ValueError(f"labels has shape {labels.shape}, expected ({len(paths)},): one per path")
            if labels.dtype.kind not in "iub":
                raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
            labels = labels.astype(np.int64)
        if size is not None:
            try:
                h, w = size
                ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in (h, w))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"size must be (height, width) with positive integers, got {size!r}")
            size = (int(h), int(w))
        resolved = []
        for p in paths:
            if _URL.match(p) and not allow_urls:
                raise ValueError(f"{p!r} looks like a URL or an FFmpeg protocol; pass allow_urls=True to read it")
            # An absolute path starts with '/', which FFmpeg never reads as a protocol prefix.
            resolved.append(p if _URL.match(p) else os.path.abspath(p))
        self.paths = resolved
        self.labels = labels
        self.clip_len = int(clip_len)
        self.frame_step = int(frame_step)
        self.clips_per_video = int(clips_per_video)
        self.sampling = sampling
        self.decode_threads = int(decode_threads)
        self.native = size is None
        self.size = size if size is not None else _native_size(self.paths[0])
        self._decoder = None

    @classmethod
    def from_folder(cls, root: str | os.PathLike, *, extensions: Sequence[str] = _VIDEO_EXTENSIONS,
                    **kwargs) -> "VideoClips":
        """Videos in class sub-folders: ``root/<class>/*.mp4``; labels follow the sorted class names.

        The class names are kept in ``clips.classes`` (label ``i`` is ``classes[i]``).
        """
        root = os.path.abspath(os.fspath(root))
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
        paths, labels = [], []
        exts = tuple(e.lower() for e in extensions)
        for label, name in enumerate(classes):
            for dirpath, dirnames, files in os.walk(os.path.join(root, name)):
                dirnames.sort()
                for f in sorted(files):
                    if f.lower().endswith(exts):
                        paths.append(os.path.join(dirpath, f))
                        labels.append(label)
        if not paths:
            raise ValueError(f"no videos ({', '.join(exts)}) in class folders under {root!r}")
        clips = cls(paths, labels, **kwargs)
        clips.classes = classes
        return clips

    @classmethod
    def from_csv(cls, manifest: str | os.PathLike, *, path_column: str = "path",
                 label_column: str | None = "label", **kwargs) -> "VideoClips":
        """Videos listed in a CSV (with a header) or JSON manifest; relative paths are taken
        against the manifest's folder. JSON: a list of ``{"path": ..., "label": ...}`` objects."""
        import csv
        import json

        manifest = os.path.abspath(os.fspath(manifest))
        base = os.path.dirname(manifest)
        with open(manifest, newline="") as f:
            if manifest.lower().endswith(".json"):
                rows = json.load(f)
                if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                    raise ValueError(f"{manifest!r}: expected a JSON list of objects")
            else:
                rows = list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"{manifest!r} lists no videos")
        paths, labels = [], []
        for n, row in enumerate(rows, start=2):
            if path_column not in row or not row[path_column]:
                raise ValueError(f"{manifest!r} row {n}: no {path_column!r}")
            p = str(row[path_column])
            paths.append(p if _URL.match(p) or os.path.isabs(p) else os.path.join(base, p))
            if label_column is not None:
                try:
                    labels.append(int(row[label_column]))
                except (KeyError, TypeError, ValueError):
                    raise ValueError(f"{manifest!r} row {n}: {label_column!r} must be an integer, "
                                     f"got {row.get(label_column)!r}") from None
        return cls(paths, labels if label_column is not None else None, **kwargs)

    def with_options(self, **changes) -> "VideoClips":
        """A copy with some constructor arguments changed, e.g. ``sampling="uniform"`` for evaluation."""
        kwargs = dict(labels=self.labels, clip_len=self.clip_len, frame_step=self.frame_step,
                      clips_per_video=self.clips_per_video, sampling=self.sampling,
                      size=None if self.native else self.size, allow_urls=True,
                      decode_threads=self.decode_threads)
        kwargs.update(changes)
        clips = type(self)(self.paths, **kwargs)
        if hasattr(self, "classes"):
            clips.classes = self.classes
        return clips

    def __len__(self) -> int:
        return len(self.paths) * self.clips_per_video

    def spec(self) -> Spec:
        h, w = self.size
        scalar = ((), np.dtype(np.int64))
        return {"video": ((self.clip_len, h, w, 3), np.dtype(np.uint8)),
                "label": scalar, "index": scalar, "start": scalar}

    def describe(self, index: int) -> str:
        v, c = divmod(index, self.clips_per_video)
        return f"{self.paths[v]!r}, clip {c}" if self.clips_per_video > 1 else repr(self.paths[v])

    def clip_span(self) -> int:
        return (self.clip_len - 1) * self.frame_step + 1

    def start_frame(self, num_frames: int, clip: int, rng: np.random.Generator) -> int:
        """First frame of clip ``clip`` of a video with ``num_frames`` frames."""
        last = num_frames - self.clip_span()
        if last < 0:
            raise ValueError(f"video has {num_frames} frames, shorter than one clip "
                             f"({self.clip_len} frames every {self.frame_step} = {self.clip_span()} frames)")
        if self.sampling == "random":
            return int(rng.integers(0, last + 1))
        if self.sampling == "uniform" and self.clips_per_video > 1:
            return int(round(clip * last / (self.clips_per_video - 1)))
        return last // 2

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_decoder"] = None
        return state

    def worker_init(self) -> None:
        self._decoder = _Decoder(self.size, self.native, self.decode_threads)

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        v, c = divmod(index, self.clips_per_video)
        reader = self._decoder.reader(self.paths[v])
        start = self.start_frame(len(reader), c, rng)
        frames = list(range(start, start + self.clip_span(), self.frame_step))
        self._decoder.decode(reader, self.paths[v], frames, out["video"])
        out["label"][...] = -1 if self.labels is None else self.labels[v]
        out["index"][...] = v
        out["start"][...] = start


def _native_size(path: str) -> tuple[int, int]:
    import decord

    try:
        shape = decord.VideoReader(path, num_threads=1).get_batch([0]).shape
    except Exception as e:
        raise ValueError(f"size=None: cannot read the native size of {path!r}: {e}") from e
    return int(shape[1]), int(shape[2])


class _Decoder:
    """Worker-side decoding state: open readers and the copy into the slot."""

    def __init__(self, size: tuple[int, int], native: bool, threads: int) -> None:
        import decord
        from decord._ffi.base import _LIB, check_call

        self._decord = decord
        self._copy = lambda nd, ptr, n: check_call(_LIB.DECORDArrayCopyToBytes(nd.handle, ptr, n))
        self._size = size
        self._native = native  # decode at the file's own size, and insist it is `size`
        self._threads = threads
        self._bad = set(_BAD_WIDTHS)
        self._readers: OrderedDict[tuple[str, int], object] = OrderedDict()
        self._scratch: np.ndarray | None = None

    def reader(self, path: str, width: int | None = None):
        h, w = self._size
        if width is None:
            width = w if self._native else _decode_width(w, self._bad)
        key = (path, width)
        r = self._readers.get(key)
        if r is None:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no such file: {path!r}" if not os.path.exists(path) else f"not a file: {path!r}")
            if self._native:
                r = self._decord.VideoReader(path, num_threads=self._threads)
            else:
                r = self._decord.VideoReader(path, width=width, height=h, num_threads=self._threads)
            self._readers[key] = r
            while len(self._readers) > _READER_CACHE:
                self._readers.popitem(last=False)
        else:
            self._readers.move_to_end(key)
        return r

    def decode(self, reader, path: str, frames: list[int], out: np.ndarray) -> None:
        width = self._size[1] if self._native else _decode_width(self._size[1], self._bad)
        try:
            self._decode_at(reader, frames, out, width)
        except self._decord.DECORDError as e:
            if self._native or "size must exactly match" not in str(e) or width >= self._size[1] * 64:
                raise
            self._bad.add(width)  # a width decord cannot produce here: fall back for good
            width = _decode_width(self._size[1], self._bad)
            self._decode_at(self.reader(path, width), frames, out, width)

    def _decode_at(self, reader, frames: list[int], out: np.ndarray, width: int) -> None:
        nd = reader.get_batch(frames)
        shape = tuple(nd.shape)
        t, h, w = out.shape[:3]
        if shape[1] != h or shape[2] != width:
            raise ValueError(f"video is {shape[1]}x{shape[2]} but the loader's clips are {h}x{w}; "
                             "pass size=(height, width) to resize")
        if width == w:  # one copy, from decord's frame buffer straight into the slot
            self._copy(nd, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(out.nbytes))
            return
        k = width // w
        if self._scratch is None or self._scratch.shape != (t, h, width, 3):
            self._scratch = np.empty((t, h, width, 3), np.uint8)
        s = self._scratch
        self._copy(nd, s.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(s.nbytes))
        summed = s.reshape(t, h, w, k, 3).sum(axis=3, dtype=np.uint16)
        np.floor_divide(summed + k // 2, k, out=summed)
        np.copyto(out, summed, casting="unsafe")
