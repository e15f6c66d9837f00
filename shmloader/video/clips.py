"""VideoClips: clips of ``clip_len`` frames decoded inside the workers.

What a video holds (its frame count, timestamps, size as shown) comes from ``video.probe``, the
presentation timeline libavformat gives; the frames come from decord or PyAV (``video.decord``,
``video.pyav``), chosen per file. Neither is imported here: the main process probes only the
first video, when ``size=None`` asks for the native size.

Every sample's clips are decoded in one pass: the worker works out all their frames first
(``video.sampling``), and its reader (``video.reader``) asks the file's decoder, decord or PyAV,
for the sorted union of them at once, then copies each clip (and crop window) out of that, so
each stretch of the video is decoded once rather than from the previous keyframe for every
clip (NOTE [ Decoding less, exactly ]). The same holds across samples: a worker handed several
samples of one video (see ``group_clips`` and ``engine.schedule``) decodes them all in one pass.
"""

from __future__ import annotations

import hashlib
import os
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np

from ..engine.shared import SharedStrings
from .._checks import check_bool, check_choice, check_int
from ..engine.source import Spec
from .arguments import (FirstVideo, checked_labels, checked_paths, class_videos, columns, first_rows,
                        path_list, read_only)
from .audio import audio_samples, check_audio
from .listing import SHARD_VIDEO_KEYS, csv_listing, shard_listing
from .manifest import MANIFEST_INTS, VIDEO_EXTENSIONS, class_folders
from .probe import DECODERS
from .reader import ClipReader, sample_spec
from .sampling import check_clip_options, check_spans, eval_changes
from .storage import Storage
from .tables import SharedClips

__all__ = ["VideoClips", "digest"]

_DECODER_CHOICES = ("auto", *DECODERS)
FETCH_OPTIONS = ("retries", "timeout", "block_size", "cache_bytes", "stat_ttl")
# Columns of a scan manifest a reader takes instead of probing (``video.manifest.row_info``), and
# of tar members' places (``from_shards``).
MANIFEST_COLUMNS = (*MANIFEST_INTS, "fps", "decoder", "cfr")
MEMBER_COLUMNS = ("offset", "size")


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
    loader's shuffle window, see ``Loader``).

    Where the videos live: ``paths`` are local files or fsspec URLs (``s3://``, ``gs://``,
    ``az://``, ``https://``, ``hf://``, members of tar shards as ``tar://key.mp4::<shard URL>``;
    the protocol's package is an extra, e.g. ``shmloader[s3]``), with ``storage_options`` passed
    to the filesystem (credentials, endpoint; or one dict per protocol). A remote file is read by
    byte range, only what a clip needs (NOTE [ Reading remote files ] in ``video.storage``), and
    PyAV decodes it, as ``fetch`` says (below). Other strings with a protocol prefix (FFmpeg's
    ``concat:``, ``pipe:``...) are refused unless ``allow_urls=True``.

    Which decoder: ``decoder="auto"`` lets each file's probe choose — decord only in the
    (container, codec) shapes whose random access is shown exact, and there not for long videos,
    edit lists that drop frames, size changes, rotation, a frame count the container
    contradicts, and any file decord refuses; PyAV for everything else (NOTE [ Which decoder
    reads a file ] in ``video.probe``); ``"decord"``
    or ``"pyav"`` forces one. Frame counts, indices and timestamps are the probe's whichever
    decoder runs. ``decode_threads``: threads each worker's decoder uses (1: the workers are the
    parallelism).

    :param paths: video files, fsspec URLs or tar members (``tar://key.mp4::<shard>``).
    :param labels: an integer per path (``label`` is -1 without them).
    :param clip_len: frames per clip (16 by default; not with ``max_frames``).
    :param frame_step: take every ``frame_step``-th frame.
    :param clips_per_video: samples per video in an epoch.
    :param clips_per_sample: clips of one video in each sample (a ``[K, ...]`` leading axis).
    :param sampling: ``"random"``, ``"uniform"``, ``"center"``, ``"segments"`` (TSN: one frame
        in each of ``clip_len`` equal stretches) or ``"segments_uniform"``.
    :param fps: pick frames every ``1/fps`` seconds of presentation time instead of by index.
    :param max_frames: with ``fps``: up to this many frames of the whole video (or span), evenly
        thinned, padded, with a ``mask`` field.
    :param spans: per path ``(start, end)`` seconds (None: open) the clips must lie in.
    :param short_video: ``"error"``, ``"repeat_last"`` or ``"wrap"`` for a video shorter than a clip.
    :param size: ``(height, width)`` every frame is stretched to while decoding; None: native.
    :param scale: the short side scaled to ``S``, or drawn in ``(S_min, S_max)``; needs ``crop``.
    :param crop: ``(height, width)`` window cut at ``crop_at``.
    :param crop_at: ``"center"``, ``"random"`` or ``"three"`` (three views per clip).
    :param group_clips: decode the samples of a video together, in one pass by one worker.
    :param allow_urls: hand other protocol strings (``concat:``, ``pipe:``...) to FFmpeg.
    :param decode_threads: threads each worker's decoder uses.
    :param decoder: ``"auto"`` (each file's probe chooses), ``"decord"`` or ``"pyav"``.
    :param storage_options: options of the fsspec filesystem (credentials, endpoint), or one
        dict per protocol.
    :param fetch: remote reads, per worker: ``retries`` (5, backoff from 0.1 s), ``timeout`` (30 s
        a request), ``block_size`` (128 KiB), ``cache_bytes`` (64 MiB), ``stat_ttl`` (60 s: how
        long a file's size and mtime are trusted before asked again).
    :param manifest: a scan manifest's probe columns, one row per path (``from_csv``).
    :param members: tar members' ``offset`` and ``size`` per path, -1 where unknown (``from_shards``).
    :param classes: the class names, label ``i`` is ``classes[i]`` (``from_folder``).
    :param audio_rate: Hz of each clip's audio (``audio``, ``audio_len``: ``video.audio``); None: none.
    :param audio_channels: 1 (mono: stereo's mean) or 2 (stereo: mono copied to both).
    :param audio_seconds: the longest span a clip may have (``S``); None: from the clips.
        Required with segments and ``max_frames``, whose samples span the whole video (or its
        span): the room every sample's audio has, a longer span cut there (``audio_len == S``).
    :raises ValueError: a bad argument, naming it.

    A ``VideoClips`` is a description and does not change once made (``with_options`` makes a
    changed copy); each loader keeps what it needs to run it (``for_workers``).
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None, *,
                 clip_len: int | None = None, frame_step: int = 1, clips_per_video: int = 1,
                 clips_per_sample: int = 1, sampling: str = "random", fps: float | None = None,
                 max_frames: int | None = None, spans: Sequence[tuple[float | None, float | None]] | None = None,
                 short_video: str = "error", size: tuple[int, int] | None = None,
                 scale: int | tuple[int, int] | None = None, crop: tuple[int, int] | None = None,
                 crop_at: str = "center", group_clips: bool = False, allow_urls: bool = False,
                 decode_threads: int = 1, decoder: str = "auto",
                 storage_options: dict[str, Any] | None = None, fetch: dict[str, Any] | None = None,
                 manifest: Mapping[str, np.ndarray] | None = None, members: Mapping[str, np.ndarray] | None = None,
                 classes: Sequence[str] | None = None, audio_rate: int | None = None, audio_channels: int = 1,
                 audio_seconds: float | None = None) -> None:
        given = path_list(paths)
        if not given:
            raise ValueError("paths is empty")
        clip_len, fps, size, scale, crop = check_clip_options(
            clip_len=clip_len, frame_step=frame_step, clips_per_video=clips_per_video,
            clips_per_sample=clips_per_sample, sampling=sampling, fps=fps, short_video=short_video,
            size=size, scale=scale, crop=crop, crop_at=crop_at, max_frames=max_frames)
        times = check_spans(spans, len(given))
        codes = None if labels is None else checked_labels(labels, len(given))
        check_choice("decoder", decoder, _DECODER_CHOICES)
        check_int("decode_threads", decode_threads, 1)
        self.audio_rate, self.audio_channels, self.audio_seconds = check_audio(
            audio_rate, audio_channels, audio_seconds, sampling=sampling, max_frames=max_frames)
        check_bool("group_clips", group_clips)
        self.fetch = dict(fetch or {})
        if set(self.fetch) - set(FETCH_OPTIONS):
            raise ValueError(f"fetch takes {FETCH_OPTIONS}, got {sorted(set(self.fetch) - set(FETCH_OPTIONS))}")
        self.storage = Storage(storage_options, **self.fetch)
        resolved, remote = checked_paths(given, allow_urls)
        if remote and decoder == "decord":
            raise ValueError("decoder='decord' reads local files only; remote paths are read by PyAV "
                             "(decoder='auto' or 'pyav')")
        self.paths = resolved
        self.remote = remote  # any path read through fsspec: decided here, never asked again
        self.labels = codes
        self.spans = times  # [n, 2] seconds from each video's first frame, or None
        # Rows of one file (several spans of a video): the first row's index, so that a worker
        # handed several of them decodes the file once (read_many).
        self.files = None if times is None else first_rows(resolved)
        self.max_frames = None if max_frames is None else int(max_frames)
        self.clip_len, self.frame_step = clip_len, int(frame_step)
        self.clips_per_video, self.clips_per_sample = int(clips_per_video), int(clips_per_sample)
        self.sampling, self.fps, self.short_video = sampling, fps, short_video
        self.scale, self.crop, self.crop_at = scale, crop, crop_at
        self.group_clips, self.decode_threads, self.decoder = group_clips, int(decode_threads), decoder
        # Decoded at the file's own size: with a crop, any size at least the crop will do;
        # without, every video must have the first one's size.
        self.native = size is None and scale is None
        first = FirstVideo(self.paths[0], self.storage)  # probed here when asked, once
        self.size = first.native_size() if self.native and crop is None else size  # decoded at, when fixed
        self.audio_samples = audio_samples(self, first)  # S, 0 without audio
        read_only(self.labels, self.spans, self.files)
        self.manifest = columns("manifest", manifest, MANIFEST_COLUMNS, len(resolved))
        self.members = columns("members", members, MEMBER_COLUMNS, len(resolved))
        self.classes = None if classes is None else [str(c) for c in classes]
        # Encoded now, so that a loader over a million videos starts as fast as over eight (not
        # pickled: a loader over a copy encodes them when it starts).
        self._encoded: tuple[np.ndarray, np.ndarray] | None = SharedStrings.encode(self.paths)
        self._made = True

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_made"):
            raise AttributeError(f"a VideoClips does not change once made: with_options({name}=...) "
                                 f"makes a copy with another {name}")
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        """By value, without what is derived from the paths (a few bytes less per Ray task)."""
        state = self.__dict__.copy()
        state["_encoded"] = None
        state.pop("_digest", None)
        return state

    @classmethod
    def from_folder(cls, root: str | os.PathLike[str], *, extensions: Sequence[str] = VIDEO_EXTENSIONS,
                    **kwargs: Any) -> VideoClips:
        """Videos in class sub-folders ``root/<class>/*.mp4``, labelled in the sorted class names'
        order: ``clips.classes[i]`` names label ``i``."""
        found = class_videos(root := os.path.abspath(os.fspath(root)), extensions)
        return cls([p for p, _ in found], [label for _, label in found], classes=class_folders(root), **kwargs)

    @classmethod
    def from_csv(cls, manifest: str | os.PathLike[str], *, path_column: str = "path",
                 label_column: str | None = "label", start_column: str = "start", end_column: str = "end",
                 **kwargs: Any) -> VideoClips:
        """Videos listed in a CSV (with a header) or JSON manifest; relative paths are taken
        against the manifest's folder. JSON: a list of ``{"path": ..., "label": ...}`` objects.

        With a ``start`` and/or ``end`` column (seconds; an empty cell is open), each row is a
        time span of its video:
        its clips lie inside the span (``clips_per_video`` samples per row); several rows may
        name one video.

        A manifest written by ``shmloader scan`` also gives every video's frame count, size,
        frame rate and decoder: workers use them instead of probing the file again, as long as
        its size and modification time are those the row was made from (else it is probed). A
        file PyAV reads is still probed, for the timestamps it seeks by (``stats()["probes"]``).
        Rows the scan found ``unreadable`` are left out, with a warning that counts them."""
        listed = csv_listing(manifest, path_column, label_column, start_column, end_column)
        if "spans" not in kwargs and listed.spans is not None:
            kwargs["spans"] = listed.spans
        return cls(listed.paths, listed.labels, manifest=listed.known, members=listed.members, **kwargs)

    @classmethod
    def from_shards(cls, urls: str | Sequence[str], *, video_key: str | Sequence[str] = SHARD_VIDEO_KEYS,
                    label_key: str | None = "cls", storage_options: dict[str, Any] | None = None,
                    fetch: dict[str, Any] | None = None, **kwargs: Any) -> VideoClips:
        """Every sample of WebDataset tar shards (video2dataset's output): a sample is the members
        sharing a key (``key.mp4`` beside ``key.cls`` / ``key.json`` / ``key.txt``), its video the
        first member with an extension in ``video_key``.

        ``urls``: shard paths or URLs, a brace pattern (``s3://b/shard-{000..099}.tar``) or a glob
        (``s3://b/shards/*.tar``). Labels: ``label_key="cls"`` reads ``key.cls`` (an integer),
        ``"json:<field>"`` a field of ``key.json``; None, no labels. Each shard's headers are read
        once here (tarfile seeks past the members' data); the workers get every member's offset
        and size and read a member by byte range (``tar://key.mp4::<shard>`` paths).
        """
        listed = shard_listing(urls, video_key, label_key, Storage(storage_options, **(fetch or {})))
        return cls(listed.paths, listed.labels, storage_options=storage_options, fetch=fetch,
                   members=listed.members, **kwargs)

    def options(self) -> dict[str, Any]:
        """The constructor's keyword arguments that made this source (paths aside)."""
        return dict(labels=self.labels, clip_len=None if self.max_frames else self.clip_len,
                    frame_step=self.frame_step, clips_per_video=self.clips_per_video,
                    clips_per_sample=self.clips_per_sample, sampling=self.sampling, fps=self.fps,
                    max_frames=self.max_frames, spans=None if self.spans is None else self.spans.tolist(),
                    short_video=self.short_video,
                    size=None if self.native else self.size, scale=self.scale, crop=self.crop,
                    crop_at=self.crop_at, group_clips=self.group_clips, allow_urls=True,
                    decode_threads=self.decode_threads, decoder=self.decoder,
                    storage_options=self.storage.options, fetch=self.fetch, manifest=self.manifest,
                    members=self.members, classes=self.classes, audio_rate=self.audio_rate,
                    audio_channels=self.audio_channels, audio_seconds=self.audio_seconds)

    def with_options(self, **changes: Any) -> VideoClips:
        """A copy with some constructor arguments changed, e.g. ``sampling="uniform"`` for evaluation."""
        kwargs = self.options()
        if "audio_rate" in changes and changes["audio_rate"] is None:
            kwargs["audio_seconds"] = None  # no audio: no room for it
        kwargs.update(changes)
        return type(self)(self.paths, **kwargs)

    def for_eval(self) -> VideoClips:
        """The same clips made deterministic for evaluation: ``sampling="uniform"`` instead of
        random starts (``"segments_uniform"`` instead of ``"segments"``: each segment's centre),
        the short side ``S_min`` of a ``scale`` range, ``crop_at="center"`` instead of random
        windows (``"three"`` stays)."""
        changes = eval_changes(self.sampling, self.scale, self.crop_at)
        return self.with_options(**changes) if changes else self

    def __len__(self) -> int:
        return len(self.paths) * self.clips_per_video

    def fingerprint(self) -> str:
        """A hash of the videos, in order, and their labels, which a loader's saved state carries."""
        return self._digest

    @cached_property
    def _digest(self) -> str:  # cached_property writes the instance's dict: no __setattr__
        return _fingerprint(self.paths, self.labels)

    @property
    def views(self) -> int:
        """Views per sample: clips, times three with ``crop_at="three"``."""
        return self.clips_per_sample * (3 if self.crop_at == "three" else 1)

    @property
    def group_size(self) -> int:
        """Consecutive sample indices the loader may hand to one worker to decode in one pass
        (with rows sharing a video, see ``group_ids``: the mean samples per video, rounded up)."""
        if not self.group_clips:
            return 1
        ids = self.group_ids()
        return self.clips_per_video if ids is None else -(-len(ids) // (int(ids.max()) + 1))

    def group_ids(self) -> np.ndarray | None:
        """With ``group_clips`` and several rows (spans) of one video: the video of each sample
        (0, 1, ... in order of first appearance), so that the loader groups every sample of a
        video, of all its rows; else None (groups are ``group_size`` consecutive samples)."""
        if not self.group_clips or self.files is None or np.array_equal(self.files, np.arange(len(self.files))):
            return None
        _, dense = np.unique(self.files, return_inverse=True)
        return np.repeat(dense.astype(np.int64), self.clips_per_video)

    def spec(self) -> Spec:
        return sample_spec(self)

    def describe(self, index: int) -> str:
        v, c = divmod(index, self.clips_per_video)
        name = repr(self.storage.name(self.paths[v]))
        return f"{name}, clip {c}" if self.clips_per_video > 1 else name

    def reader(self) -> ClipReader:
        """A reader of these samples in this process: ``reader().read([0, 5, 9])`` gives their
        arrays as a loader's batch holds them (``video.reader``), with no loader running."""
        return ClipReader(self)

    def for_workers(self) -> SharedClips:
        """What one loader's workers run for these clips (its columns shared, its workers' probes
        shared): the loader that asks owns it (``video.tables``)."""
        return SharedClips(self, self._encoded)


def digest(clips: VideoClips) -> str:
    """A hash of the whole description (videos, labels, options, manifest columns): equal
    descriptions give equal digests in any process (Ray's task workers keep a reader per digest)."""
    h = hashlib.sha256()
    _feed(h, clips.__getstate__())
    return h.hexdigest()[:16]


def _feed(h: Any, value: Any) -> None:
    """``value`` into the hash ``h`` by content (a pickle's bytes depend on shared references)."""
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"{k!r}:".encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        h.update("\0".join(value).encode("utf-8", "surrogateescape"))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _feed(h, v)
    elif isinstance(value, Storage):
        _feed(h, value.__getstate__())
    else:
        h.update(repr(value).encode())
    h.update(b";")


def _fingerprint(paths: list[str], labels: np.ndarray | None) -> str:
    """``VideoClips.fingerprint``: a loader over other videos, or other labels, refuses the state."""
    h = hashlib.sha256("\0".join(paths).encode("utf-8", "surrogateescape"))
    h.update(b"" if labels is None else np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]
