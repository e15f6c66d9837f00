"""VideoClips: clips of ``clip_len`` frames decoded inside the workers.

What a video holds (its frame count, timestamps, size as shown) comes from ``_probe``, the
presentation timeline libavformat gives; the frames come from decord or PyAV (``_decoders``),
chosen per file. Neither is imported here: the main process probes only the first video, when
``size=None`` asks for the native size.

Every sample's clips are decoded in one pass: the worker works out all their frames first
(``_sampling``), asks decord for the sorted union of them in ONE ``get_batch`` call, and
then copies each clip (and crop window) out of that. decord seeks back to a keyframe on every
``get_batch`` call, so one call over the union decodes each stretch of the video once, where
a call per clip would decode from the previous keyframe every time (1.6-3x the work on real
videos). The same holds across samples: a worker handed several samples of one video (see
``group_clips`` and ``_schedule``) decodes them all in one pass.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ._manifest import URL, VIDEO_EXTENSIONS, class_folders, iter_manifest, known_columns, row_info, walk_folder
from ._probe import DECODERS, VideoInfo
from ._sampling import check_clip_options, clip_frames, crop_windows, scaled_size
from ._shared import SharedStrings
from ._source import Spec, check_int

__all__ = ["VideoClips"]

_DECODER_CHOICES = ("auto", *DECODERS)


class VideoClips:
    """Clips from video files, decoded in the workers.

    Each sample, with ``K = clips_per_sample`` clips and ``V`` views (``K``, or ``3 * K`` with
    ``crop_at="three"``): ``video`` uint8 ``[T, H, W, 3]`` when ``V == 1``, else
    ``[V, T, H, W, 3]`` (view ``k * 3 + c`` is clip ``k``, crop ``c``); ``frames`` int64
    ``[T]`` (``[K, T]``), the index in the video of every delivered frame; ``start`` int64
    (``[K]``), each clip's first frame; ``label`` int64 (-1 without labels); ``index`` int64,
    the video's position in ``paths``. There are ``len(paths) * clips_per_video`` samples.

    Which frames: ``clip_len`` frames every ``frame_step`` frames, or with ``fps=F`` every
    ``1/F`` seconds of video time. ``sampling``: ``"random"`` (independent seeded starts, new
    each epoch), ``"uniform"`` (spread evenly over the video), ``"center"``. ``short_video``:
    ``"error"``, ``"repeat_last"`` or ``"wrap"`` for videos shorter than one clip.

    Which pixels: ``size=(h, w)`` stretches every frame to ``h x w`` while decoding; ``None``
    keeps the native size (every video must share it unless ``crop`` is set).
    ``scale=S`` or ``(S_min, S_max)`` scales the short side to ``S`` (drawn per sample, or per
    video and epoch with ``group_clips``) keeping the aspect ratio, in the decoder; ``crop=(h,
    w)`` then cuts a window at ``crop_at``: ``"center"``, ``"random"`` (seeded, one per clip)
    or ``"three"`` (left/top, center, right/bottom along the long side).

    ``group_clips=True``: the ``clips_per_video`` samples of a video may be decoded together,
    in one pass by one worker, and placed at several positions of the coming batches (the
    loader's shuffle window, see ``Loader``). Paths are local files: URLs and FFmpeg protocol
    strings (``http:``, ``concat:``...) are refused unless ``allow_urls=True``.

    Which decoder: ``decoder="auto"`` lets each file's probe choose — decord only in the
    (container, codec) shapes whose random access is shown exact, and there not for long videos,
    edit lists that drop frames, size changes, rotation, a frame count the container
    contradicts, and any file decord refuses; PyAV for everything else (NOTE [ Which decoder
    reads a file ] in ``_probe``); ``"decord"``
    or ``"pyav"`` forces one. Frame counts, indices and timestamps are the probe's whichever
    decoder runs. ``decode_threads``: threads each worker's decoder uses (1: the workers are the
    parallelism).
    """

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None, *,
                 clip_len: int = 16, frame_step: int = 1, clips_per_video: int = 1,
                 clips_per_sample: int = 1, sampling: str = "random", fps: float | None = None,
                 short_video: str = "error", size: tuple[int, int] | None = None,
                 scale: int | tuple[int, int] | None = None, crop: tuple[int, int] | None = None,
                 crop_at: str = "center", group_clips: bool = False, allow_urls: bool = False,
                 decode_threads: int = 1, decoder: str = "auto") -> None:
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise ValueError("paths is empty")
        fps, size, scale, crop = check_clip_options(
            clip_len=clip_len, frame_step=frame_step, clips_per_video=clips_per_video,
            clips_per_sample=clips_per_sample, sampling=sampling, fps=fps, short_video=short_video,
            size=size, scale=scale, crop=crop, crop_at=crop_at)
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != (len(paths),):
                raise ValueError(f"labels has shape {labels.shape}, expected ({len(paths)},): one per path")
            if labels.dtype.kind not in "iub":
                raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
            labels = labels.astype(np.int64)
        if decoder not in _DECODER_CHOICES:
            raise ValueError(f"decoder must be one of {_DECODER_CHOICES}, got {decoder!r}")
        check_int("decode_threads", decode_threads, 1)
        if not isinstance(group_clips, bool):
            raise ValueError(f"group_clips must be True or False, got {group_clips!r}")
        resolved = []
        for p in paths:
            if URL.match(p) and not allow_urls:
                raise ValueError(f"{p!r} looks like a URL or an FFmpeg protocol; pass allow_urls=True to read it")
            # An absolute path starts with '/', which FFmpeg never reads as a protocol prefix.
            resolved.append(p if URL.match(p) else os.path.abspath(p))
        self.paths = resolved
        self.labels = labels
        self.clip_len = int(clip_len)
        self.frame_step = int(frame_step)
        self.clips_per_video = int(clips_per_video)
        self.clips_per_sample = int(clips_per_sample)
        self.sampling = sampling
        self.fps = fps
        self.short_video = short_video
        self.scale = scale
        self.crop = crop
        self.crop_at = crop_at
        self.group_clips = group_clips
        self.decode_threads = int(decode_threads)
        self.decoder = decoder
        # Decoded at the file's own size: with a crop, any size at least the crop will do;
        # without, every video must have the first one's size.
        self.native = size is None and scale is None
        if size is None and scale is None and crop is None:
            size = _native_size(self.paths[0])
        self.size = size  # the size frames are decoded at, when it is fixed
        self._decoding = None
        self._known: dict[str, np.ndarray] | None = None  # manifest columns, see from_csv
        self._table: SharedStrings | None = None
        # Encoded now, so that a loader over a million videos starts as fast as over eight.
        self._encoded = SharedStrings.encode(self.paths)
        self._users = 0  # loaders holding the table (acquire/release)

    @classmethod
    def from_folder(cls, root: str | os.PathLike, *, extensions: Sequence[str] = VIDEO_EXTENSIONS,
                    **kwargs) -> "VideoClips":
        """Videos in class sub-folders: ``root/<class>/*.mp4``; labels follow the sorted class names.

        The class names are kept in ``clips.classes`` (label ``i`` is ``classes[i]``).
        """
        root = os.path.abspath(os.fspath(root))
        found = list(walk_folder(root, extensions))
        if not found:
            raise ValueError(f"no videos ({', '.join(extensions)}) in class folders under {root!r}")
        clips = cls([p for p, _ in found], [label for _, label in found], **kwargs)
        clips.classes = class_folders(root)
        return clips

    @classmethod
    def from_csv(cls, manifest: str | os.PathLike, *, path_column: str = "path",
                 label_column: str | None = "label", **kwargs) -> "VideoClips":
        """Videos listed in a CSV (with a header) or JSON manifest; relative paths are taken
        against the manifest's folder. JSON: a list of ``{"path": ..., "label": ...}`` objects.

        A manifest written by ``shmloader scan`` also gives every video's frame count, size,
        frame rate and decoder: workers use them instead of probing the file again, as long as
        its size and modification time are those the row was made from (else it is probed). A
        file PyAV reads is still probed, for the timestamps it seeks by (``stats()["probes"]``)."""
        manifest = os.path.abspath(os.fspath(manifest))
        listed = list(iter_manifest(manifest, path_column, label_column))
        if not listed:
            raise ValueError(f"{manifest!r} lists no videos")
        labels = None if label_column is None else [label for _, label, _ in listed]
        clips = cls([p for p, _, _ in listed], labels, **kwargs)
        clips._known = known_columns([row for _, _, row in listed])
        return clips

    def options(self) -> dict:
        """The constructor's keyword arguments that made this source (paths aside)."""
        return dict(labels=self.labels, clip_len=self.clip_len, frame_step=self.frame_step,
                    clips_per_video=self.clips_per_video, clips_per_sample=self.clips_per_sample,
                    sampling=self.sampling, fps=self.fps, short_video=self.short_video,
                    size=None if self.native else self.size, scale=self.scale, crop=self.crop,
                    crop_at=self.crop_at, group_clips=self.group_clips, allow_urls=True,
                    decode_threads=self.decode_threads, decoder=self.decoder)

    def with_options(self, **changes) -> "VideoClips":
        """A copy with some constructor arguments changed, e.g. ``sampling="uniform"`` for evaluation."""
        kwargs = self.options()
        kwargs.update(changes)
        clips = type(self)(self.paths, **kwargs)
        clips._known = self._known
        if hasattr(self, "classes"):
            clips.classes = self.classes
        return clips

    def for_eval(self) -> "VideoClips":
        """The same clips made deterministic for evaluation: ``sampling="uniform"`` instead of
        random starts, the short side ``S_min`` of a ``scale`` range, ``crop_at="center"``
        instead of random windows (``"three"`` stays)."""
        changes = {}
        if self.sampling == "random":
            changes["sampling"] = "uniform"
        if self.scale is not None and self.scale[0] != self.scale[1]:
            changes["scale"] = self.scale[0]
        if self.crop_at == "random":
            changes["crop_at"] = "center"
        return self.with_options(**changes) if changes else self

    def __len__(self) -> int:
        return len(self.paths) * self.clips_per_video

    @property
    def views(self) -> int:
        """Views per sample: clips, times three with ``crop_at="three"``."""
        return self.clips_per_sample * (3 if self.crop_at == "three" else 1)

    @property
    def group_size(self) -> int:
        """Consecutive sample indices the loader may hand to one worker to decode in one pass."""
        return self.clips_per_video if self.group_clips else 1

    def spec(self) -> Spec:
        h, w = self.crop or self.size
        k, t, v = self.clips_per_sample, self.clip_len, self.views
        scalar = ((), np.dtype(np.int64))
        lead = () if k == 1 else (k,)
        return {"video": ((t, h, w, 3) if v == 1 else (v, t, h, w, 3), np.dtype(np.uint8)),
                "label": scalar, "index": scalar, "start": (lead, np.dtype(np.int64)),
                "frames": ((*lead, t), np.dtype(np.int64))}

    def describe(self, index: int) -> str:
        v, c = divmod(index, self.clips_per_video)
        return f"{self.paths[v]!r}, clip {c}" if self.clips_per_video > 1 else repr(self.paths[v])

    def _shared_table(self) -> SharedStrings:
        """Paths and labels in one shared segment, made when a loader first sends this source to
        its workers: each worker maps it instead of unpickling its own copy, so a worker's
        memory does not grow with the number of videos."""
        if self._table is None:
            columns = {} if self.labels is None else {"labels": self.labels}
            columns.update({f"known_{k}": a for k, a in (self._known or {}).items()})
            self._table = SharedStrings(self._encoded, columns)
        return self._table

    @property
    def fds(self) -> tuple[int, ...]:
        """Descriptors the workers must inherit (the shared path table)."""
        return (self._shared_table().fd,)

    def acquire(self) -> None:
        """A loader starts using this source: keep the shared table until it calls release()."""
        self._users += 1
        self._shared_table()

    def release(self) -> None:
        """A loader is done: the last one closes the table's descriptor (workers are gone)."""
        self._users -= 1
        if self._users <= 0 and self._table is not None:
            self._table.close()
            self._table = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_decoding"] = None
        state["paths"] = self._shared_table()  # indexable like the list, a few bytes to pickle
        state["_table"], state["_users"], state["_encoded"] = None, 0, None
        state["_has_labels"], state["labels"] = self.labels is not None, None
        state["_known"] = None if self._known is None else list(self._known)
        return state

    def worker_init(self) -> None:
        from ._decoders import Decoding

        if self.__dict__.pop("_has_labels", False):
            self.labels = self.paths.column("labels")
        if self._known is not None:
            self._known = {k: self.paths.column(f"known_{k}") for k in self._known}
        self._decoding = Decoding(self.decode_threads, self.decoder)

    def counters(self) -> dict[str, int]:
        """In a worker: decodes by decord and by PyAV, decodes decord handed to PyAV, probes
        read again (an index-read timeline found wrong) and files probed so far; the loader's
        ``stats()`` sums them over its workers (``_protocol.COUNTS``)."""
        d = self._decoding
        if d is None:
            return {}
        return {"decord": d.decodes["decord"], "pyav": d.decodes["pyav"], "decoder_fallbacks": d.fallbacks,
                "reprobes": d.reprobes, "probes": d.probes}

    def _info(self, v: int, path: str) -> VideoInfo:
        """Video ``v`` as the probe sees it: its manifest row while the file is unchanged."""
        row = None if self._known is None else row_info(self._known, v, path)
        return self._decoding.info(path) if row is None else self._decoding.info(path, *row)

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        self.read_many([index], [rng], [out])

    def read_many(self, indices: list[int], rngs: list[np.random.Generator],
                  outs: list[dict[str, np.ndarray]], epoch_key: tuple[int, int] | None = None) -> None:
        """Write samples ``indices`` into ``outs``, one decode pass per video and scale.

        ``epoch_key=(seed, epoch)`` seeds what the samples of one video share in an epoch with
        ``group_clips`` (the scale), so grouping never changes what a sample holds.
        """
        by_video: dict[int, list[int]] = {}
        for i, index in enumerate(indices):
            by_video.setdefault(index // self.clips_per_video, []).append(i)
        for v, items in by_video.items():
            self._read_video(v, [(indices[i] % self.clips_per_video, rngs[i], outs[i]) for i in items],
                             epoch_key)

    def _read_video(self, v: int, items: list, epoch_key) -> None:
        path, k = self.paths[v], self.clips_per_sample
        info = self._info(v, path)
        n = info.frames
        pts = None
        if self.fps is not None:
            pts = info.times()
            if pts is None:  # a manifest row of a variable-rate video: read the timestamps
                pts = self._decoding.info(path).times()
        native = (info.height, info.width)
        if self.native and self.crop is None and native != tuple(self.size):
            raise ValueError(f"video is {native[0]}x{native[1]} but the loader's clips are "
                             f"{self.size[0]}x{self.size[1]}; pass size=(height, width) to resize, or crop=")
        fixed = None if self.native else self.size  # decode size unless scaled per video
        shared_scale = None
        if self.scale is not None and self.group_clips and epoch_key is not None:
            shared_scale = _draw_scale(np.random.default_rng((*epoch_key, v, 1)), self.scale)
        plans = []  # (out, frames [K, T], decode size, rng) per sample
        for c, rng, out in items:
            frames = clip_frames(n, pts, clip_len=self.clip_len, frame_step=self.frame_step, fps=self.fps,
                                 sampling=self.sampling, clips=[c * k + j for j in range(k)],
                                 total_clips=self.clips_per_video * k, short_video=self.short_video, rng=rng)
            size = fixed
            if self.scale is not None:
                s = shared_scale if shared_scale is not None else _draw_scale(rng, self.scale)
                size = scaled_size(*native, s)
            plans.append((out, frames, size, rng))
        for size in dict.fromkeys(p[2] for p in plans):  # one pass per decode size
            group = [p for p in plans if p[2] == size]
            union = np.unique(np.concatenate([p[1].ravel() for p in group]))
            direct = None
            if len(group) == 1 and k == 1 and self.crop is None and np.array_equal(union, group[0][1][0]):
                direct = group[0][0]["video"]  # the clip is the union: decode straight into the slot
            decoded = self._decoding.decode(info, size, union, direct)
            for out, frames, _, rng in group:
                _fill(self, out, v, frames, union, decoded, rng, done=decoded is direct)


def _fill(clips: VideoClips, out, v, frames, union, decoded, rng, done: bool) -> None:
    """Sample ``out`` of video ``v``: its clips (and crop windows) copied out of ``decoded``
    (the frames ``union``), unless ``done`` (decoded straight into the slot), and its fields."""
    k, t = frames.shape
    if not done:
        where = np.searchsorted(union, frames)  # [K, T] rows of `decoded`
        video = _view(out["video"], (k, clips.views // k, t, *out["video"].shape[-3:]))
        if clips.crop is None:
            for j in range(k):
                np.copyto(video[j, 0], decoded[where[j]])
        else:
            ch, cw = clips.crop
            corners = crop_windows(decoded.shape[1], decoded.shape[2], clips.crop, clips.crop_at, k, rng)
            for j in range(k):
                for c, (y, x) in enumerate(corners[j]):
                    np.copyto(video[j, c], decoded[where[j], y : y + ch, x : x + cw])
    out["label"][...] = -1 if clips.labels is None else clips.labels[v]
    out["index"][...] = v
    out["start"][...] = frames[:, 0].reshape(out["start"].shape)
    out["frames"][...] = frames.reshape(out["frames"].shape)


def _view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` seen with another shape; raises rather than copy (a copy would not reach the slot)."""
    b = a.view()
    b.shape = shape
    return b


def _draw_scale(rng: np.random.Generator, scale: tuple[int, int]) -> int:
    lo, hi = scale
    return lo if lo == hi else int(rng.integers(lo, hi + 1))


def _native_size(path: str) -> tuple[int, int]:
    """The first video's size as shown, read in the main process as a worker reads it."""
    from ._probe import probe

    try:
        info = probe(path)
    except Exception as e:
        raise ValueError(f"size=None: cannot read the native size of {path!r}: {e}") from e
    return info.height, info.width
