"""VideoClips: clips of ``clip_len`` frames decoded inside the workers.

What a video holds (its frame count, timestamps, size as shown) comes from ``video.probe``, the
presentation timeline libavformat gives; the frames come from decord or PyAV (``video.decoders``),
chosen per file. Neither is imported here: the main process probes only the first video, when
``size=None`` asks for the native size.

Every sample's clips are decoded in one pass: the worker works out all their frames first
(``video.sampling``), asks decord for the sorted union of them in ONE ``get_batch`` call, and
then copies each clip (and crop window) out of that. decord seeks back to a keyframe on every
``get_batch`` call, so one call over the union decodes each stretch of the video once, where
a call per clip would decode from the previous keyframe every time (1.6-3x the work on real
videos). The same holds across samples: a worker handed several samples of one video (see
``group_clips`` and ``engine.schedule``) decodes them all in one pass.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from .manifest import URL, VIDEO_EXTENSIONS, class_folders, iter_manifest, known_columns, row_info, walk_folder
from .probe import DECODERS, VideoInfo
from .sampling import SEGMENTS, check_clip_options, check_spans, clip_frames, crop_windows, rate_frames, scaled_size
from ..engine.shared import SharedStrings
from ..engine.source import Spec, check_int
from .media import is_remote, local_path, member_url, split_member
from .shards import expand, shard_samples
from .storage import Storage, tar_members

if TYPE_CHECKING:
    from .decoding import Decoding

__all__ = ["VideoClips"]

_DECODER_CHOICES = ("auto", *DECODERS)
FETCH_OPTIONS = ("retries", "timeout", "block_size", "cache_bytes", "stat_ttl")

# The members of a WebDataset sample that hold its video, by extension (the first found wins).
SHARD_VIDEO_KEYS = ("mp4", "avi", "mkv", "webm", "mov", "m4v", "mpg", "mpeg", "ts", "flv", "wmv", "ogv", "3gp")


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
    PyAV decodes it. ``fetch``: how, per worker: ``retries`` (5) with backoff from 0.1 s,
    ``timeout`` (30 s a request), ``block_size`` (128 KiB), ``cache_bytes`` (64 MiB). Other strings with a protocol prefix (FFmpeg's ``concat:``, ``pipe:``...)
    are refused unless ``allow_urls=True``.

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
    :param fetch: ``retries``, ``timeout``, ``block_size``, ``cache_bytes`` of remote reads.
    :raises ValueError: a bad argument, naming it.
    """

    classes: list[str]  # the class folder names, label i is classes[i] (from_folder only)

    def __init__(self, paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None, *,
                 clip_len: int | None = None, frame_step: int = 1, clips_per_video: int = 1,
                 clips_per_sample: int = 1, sampling: str = "random", fps: float | None = None,
                 max_frames: int | None = None, spans: Sequence[tuple[float | None, float | None]] | None = None,
                 short_video: str = "error", size: tuple[int, int] | None = None,
                 scale: int | tuple[int, int] | None = None, crop: tuple[int, int] | None = None,
                 crop_at: str = "center", group_clips: bool = False, allow_urls: bool = False,
                 decode_threads: int = 1, decoder: str = "auto",
                 storage_options: dict[str, Any] | None = None, fetch: dict[str, Any] | None = None) -> None:
        given = [os.fspath(p) for p in paths]
        if not given:
            raise ValueError("paths is empty")
        clip_len, fps, size, scale, crop = check_clip_options(
            clip_len=clip_len, frame_step=frame_step, clips_per_video=clips_per_video,
            clips_per_sample=clips_per_sample, sampling=sampling, fps=fps, short_video=short_video,
            size=size, scale=scale, crop=crop, crop_at=crop_at, max_frames=max_frames)
        times = check_spans(spans, len(given))
        codes = None
        if labels is not None:
            codes = np.asarray(labels)
            if codes.shape != (len(given),):
                raise ValueError(f"labels has shape {codes.shape}, expected ({len(given)},): one per path")
            if codes.dtype.kind not in "iub":
                raise ValueError(f"labels must be integers, got dtype {codes.dtype}")
            codes = codes.astype(np.int64)
        if decoder not in _DECODER_CHOICES:
            raise ValueError(f"decoder must be one of {_DECODER_CHOICES}, got {decoder!r}")
        check_int("decode_threads", decode_threads, 1)
        if not isinstance(group_clips, bool):
            raise ValueError(f"group_clips must be True or False, got {group_clips!r}")
        self.fetch = dict(fetch or {})
        unknown = set(self.fetch) - set(FETCH_OPTIONS)
        if unknown:
            raise ValueError(f"fetch takes {FETCH_OPTIONS}, got {sorted(unknown)}")
        self.storage = Storage(storage_options, **self.fetch)
        resolved: list[str] = []
        remote = False
        for p in given:
            p = local_path(p)
            if is_remote(p):
                remote = True
                resolved.append(p)
                continue
            if URL.match(p) and not allow_urls:
                raise ValueError(f"{p!r} looks like an FFmpeg protocol, not a file or an fsspec URL; "
                                 "pass allow_urls=True to hand it to FFmpeg")
            # An absolute path starts with '/', which FFmpeg never reads as a protocol prefix.
            resolved.append(p if URL.match(p) else os.path.abspath(p))
        for protocol in {Storage.protocol(p) for p in resolved if is_remote(p)} - {"file"}:
            Storage.filesystem_class(protocol)  # a missing package is named now, not in a worker
        if remote and decoder == "decord":
            raise ValueError("decoder='decord' reads local files only; remote paths are read by PyAV "
                             "(decoder='auto' or 'pyav')")
        self.paths = resolved
        self.labels = codes
        self.spans = times  # [n, 2] seconds from each video's first frame, or None
        # Rows of one file (several spans of a video): the first row's index, so that a worker
        # handed several of them decodes the file once (read_many).
        self.files = None if times is None else _first_rows(resolved)
        self.max_frames = None if max_frames is None else int(max_frames)
        self.clip_len = clip_len
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
            size = _native_size(self.paths[0], self.storage)
        self.size = size  # the size frames are decoded at, when it is fixed
        self._decoding: Decoding | None = None
        self._known: dict[str, np.ndarray] | None = None  # manifest columns, see from_csv
        self._members: dict[str, np.ndarray] | None = None  # offset, size of tar members, see from_shards
        self._table: SharedStrings | None = None
        # Encoded now, so that a loader over a million videos starts as fast as over eight.
        self._encoded = SharedStrings.encode(self.paths)
        self._users = 0  # loaders holding the table (acquire/release)

    @classmethod
    def from_folder(cls, root: str | os.PathLike[str], *, extensions: Sequence[str] = VIDEO_EXTENSIONS,
                    **kwargs: Any) -> VideoClips:
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
        file PyAV reads is still probed, for the timestamps it seeks by (``stats()["probes"]``)."""
        manifest = os.path.abspath(os.fspath(manifest))
        listed = list(iter_manifest(manifest, path_column, label_column))
        if not listed:
            raise ValueError(f"{manifest!r} lists no videos")
        labels: list[Any] | None = None if label_column is None else [label for _, label, _ in listed]
        rows = [row for _, _, row in listed]
        if "spans" not in kwargs and (start_column in rows[0] or end_column in rows[0]):
            kwargs["spans"] = [(_seconds(manifest, n, row.get(start_column)), _seconds(manifest, n, row.get(end_column)))
                               for n, row in enumerate(rows, start=2)]
        clips = cls([p for p, _, _ in listed], labels, **kwargs)
        clips._known = known_columns([row for _, _, row in listed])
        clips._members = _member_columns([(p, row) for p, _, row in listed])
        return clips

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
        storage = Storage(storage_options, **(fetch or {}))
        shards = expand(urls, storage)
        if not shards:
            raise ValueError(f"no shards match {urls!r}")
        exts = (video_key,) if isinstance(video_key, str) else tuple(video_key)
        paths, labels, offsets, sizes = [], [], [], []
        for shard in shards:
            members = tar_members(storage, shard)
            storage.add_members(shard, members)
            for key, parts in shard_samples(members).items():
                video = next((parts[e] for e in exts if e in parts), None)
                if video is None:
                    continue
                paths.append(member_url(video, shard))
                offsets.append(members[video][0])
                sizes.append(members[video][1])
                if label_key is not None:
                    labels.append(_shard_label(storage, shard, key, parts, label_key))
        if not paths:
            raise ValueError(f"no member of the {len(shards)} shards {storage.redact(shards[0])}... has a video "
                             f"extension among {exts}")
        clips = cls(paths, None if label_key is None else labels, storage_options=storage_options, fetch=fetch,
                    **kwargs)
        clips._members = {"offset": np.asarray(offsets, np.int64), "size": np.asarray(sizes, np.int64)}
        return clips

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
                    storage_options=self.storage.options, fetch=self.fetch)

    def with_options(self, **changes: Any) -> VideoClips:
        """A copy with some constructor arguments changed, e.g. ``sampling="uniform"`` for evaluation."""
        kwargs = self.options()
        kwargs.update(changes)
        clips = type(self)(self.paths, **kwargs)
        clips._known, clips._members = self._known, self._members
        if hasattr(self, "classes"):
            clips.classes = self.classes
        return clips

    def for_eval(self) -> VideoClips:
        """The same clips made deterministic for evaluation: ``sampling="uniform"`` instead of
        random starts (``"segments_uniform"`` instead of ``"segments"``: each segment's centre),
        the short side ``S_min`` of a ``scale`` range, ``crop_at="center"`` instead of random
        windows (``"three"`` stays)."""
        changes: dict[str, Any] = {}
        if self.sampling in ("random", "segments"):
            changes["sampling"] = {"random": "uniform", "segments": "segments_uniform"}[self.sampling]
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
        shape = self.crop or self.size
        assert shape is not None, "the constructor fixes a crop or a size"
        h, w = shape
        k, t, v = self.clips_per_sample, self.clip_len, self.views
        scalar = ((), np.dtype(np.int64))
        lead = () if k == 1 else (k,)
        spec: Spec = {"video": ((t, h, w, 3) if v == 1 else (v, t, h, w, 3), np.dtype(np.uint8)),
                "label": scalar, "index": scalar, "start": (lead, np.dtype(np.int64)),
                "frames": ((*lead, t), np.dtype(np.int64))}
        if self.max_frames is not None:  # up to max_frames frames: which are real
            spec["mask"] = ((t,), np.dtype(np.bool_))
        return spec

    def describe(self, index: int) -> str:
        v, c = divmod(index, self.clips_per_video)
        name = repr(self.storage.name(self.paths[v]))
        return f"{name}, clip {c}" if self.clips_per_video > 1 else name

    def _shared_table(self) -> SharedStrings:
        """Paths and labels in one shared segment, made when a loader first sends this source to
        its workers: each worker maps it instead of unpickling its own copy, so a worker's
        memory does not grow with the number of videos."""
        if self._table is None:
            columns: dict[str, np.ndarray] = {} if self.labels is None else {"labels": self.labels}
            if self.spans is not None and self.files is not None:
                columns.update(spans=self.spans, files=self.files)
            columns.update({f"known_{k}": a for k, a in (self._known or {}).items()})
            columns.update({f"member_{k}": a for k, a in (self._members or {}).items()})
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

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_decoding"] = None
        state["paths"] = self._shared_table()  # indexable like the list, a few bytes to pickle
        state["_table"], state["_users"], state["_encoded"] = None, 0, None
        state["_has_labels"], state["labels"] = self.labels is not None, None
        state["_has_spans"], state["spans"], state["files"] = self.spans is not None, None, None
        state["_known"] = None if self._known is None else list(self._known)
        state["_members"] = None if self._members is None else list(self._members)
        return state

    def worker_init(self) -> None:
        from .decoding import Decoding

        table = cast(SharedStrings, self.paths)  # in a worker: the shared table (see __getstate__)
        if self.__dict__.pop("_has_labels", False):
            self.labels = table.column("labels")
        if self.__dict__.pop("_has_spans", False):
            self.spans, self.files = table.column("spans"), table.column("files")
        if self._known is not None:
            self._known = {k: table.column(f"known_{k}") for k in self._known}
        if self._members is not None:
            self._members = {k: table.column(f"member_{k}") for k in self._members}
        self._decoding = Decoding(self.decode_threads, self.decoder, self.storage)

    def counters(self) -> dict[str, int]:
        """In a worker: decodes by decord and by PyAV, decodes decord handed to PyAV, probes
        read again (an index-read timeline found wrong), files probed, and bytes and requests
        fetched from remote storage so far; the loader's ``stats()`` sums them over its workers
        (``engine.protocol.COUNTS``)."""
        d = self._decoding
        if d is None:
            return {}
        return {"decord": d.decodes["decord"], "pyav": d.decodes["pyav"], "decoder_fallbacks": d.fallbacks,
                "reprobes": d.reprobes, "probes": d.probes, **self.storage.counters()}

    def _info(self, v: int, path: str) -> VideoInfo:
        """Video ``v`` as the probe sees it: its manifest row while the file is unchanged."""
        members = self._members
        member = split_member(path) if members is not None else None
        if members is not None and member is not None and members["size"][v] >= 0:  # no header is read
            self.storage.add_members(member[1], {member[0]: (int(members["offset"][v]), int(members["size"][v]))})
        row = None if self._known is None else row_info(self._known, v, path)
        return self._worker_decoding.info(path) if row is None else self._worker_decoding.info(path, *row)

    @property
    def _worker_decoding(self) -> Decoding:
        assert self._decoding is not None, "the decoders are made in the workers (worker_init)"
        return self._decoding

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        self.read_many([index], [rng], [out])

    def read_many(self, indices: list[int], rngs: list[np.random.Generator],
                  outs: list[dict[str, np.ndarray]], epoch_key: tuple[int, int] | None = None) -> None:
        """Write samples ``indices`` into ``outs``, one decode pass per video and scale.

        ``epoch_key=(seed, epoch)`` seeds what the samples of one video share in an epoch with
        ``group_clips`` (the scale), so grouping never changes what a sample holds.
        """
        by_file: dict[int, list[int]] = {}
        for i, index in enumerate(indices):
            v = index // self.clips_per_video
            by_file.setdefault(v if self.files is None else int(self.files[v]), []).append(i)
        remote = any(is_remote(self.paths[v]) for v in by_file)
        if remote and len(by_file) > 1:  # their probes' requests together, not one after another
            self._worker_decoding.probe_ahead([self.paths[v] for v in by_file])
        plans = [self._plan_video(v, [(indices[i] // self.clips_per_video, indices[i] % self.clips_per_video,
                                       rngs[i], outs[i]) for i in items], epoch_key)
                 for v, items in by_file.items()]
        if remote:  # every clip's bytes in one round of requests (NOTE [ Reading remote files ])
            self._worker_decoding.prefetch([(info, union) for _, info, passes in plans for _, _, union, _ in passes])
        for v, info, passes in plans:
            for size, group, union, direct in passes:
                decoded = self._worker_decoding.decode(info, size, union, direct)
                for out, row, frames, _, rng in group:
                    _fill(self, out, row, frames, union, decoded, rng, done=decoded is direct)

    def _plan_video(self, v: int, items: list[tuple[int, int, np.random.Generator, dict[str, np.ndarray]]],
                    epoch_key: tuple[int, int] | None) -> tuple[int, VideoInfo, list[Any]]:
        """What the samples ``items`` = [(row, clip, rng, out)] of the rows of file ``v`` take:
        ``(v, info, passes)``, a pass per decode size: ``(size, [(out, row, frames [K, T], size,
        rng)...], union of their frames, the slot to decode into directly or None)``."""
        path, k = self.paths[v], self.clips_per_sample
        info = self._info(v, path)
        n = info.frames
        pts = None
        if self.fps is not None or self.sampling in SEGMENTS or self.spans is not None:
            pts = info.times()
            if pts is None:  # a manifest row of a variable-rate video: read the timestamps
                pts = self._worker_decoding.info(path).times()
        native = (info.height, info.width)
        if self.native and self.crop is None and self.size is not None and native != tuple(self.size):
            raise ValueError(f"video is {native[0]}x{native[1]} but the loader's clips are "
                             f"{self.size[0]}x{self.size[1]}; pass size=(height, width) to resize, or crop=")
        fixed = None if self.native else self.size  # decode size unless scaled per video
        shared_scale = None
        if self.scale is not None and self.group_clips and epoch_key is not None:
            shared_scale = _draw_scale(np.random.default_rng((*epoch_key, v, 1)), self.scale)
        plans = []  # (out, row, frames [K, T], decode size, rng) per sample
        for row, c, rng, out in items:
            span = None if self.spans is None else (float(self.spans[row][0]), float(self.spans[row][1]))
            if self.max_frames is not None:
                assert self.fps is not None, "max_frames comes with fps"
                frames = rate_frames(n, pts, fps=self.fps, max_frames=self.max_frames, sampling=self.sampling,
                                     short_video=self.short_video, rng=rng, span=span)[None]
            else:
                frames = clip_frames(n, pts, clip_len=self.clip_len, frame_step=self.frame_step, fps=self.fps,
                                     sampling=self.sampling, clips=[c * k + j for j in range(k)],
                                     total_clips=self.clips_per_video * k, short_video=self.short_video, rng=rng,
                                     span=span)
            size = fixed
            if self.scale is not None:
                s = shared_scale if shared_scale is not None else _draw_scale(rng, self.scale)
                size = scaled_size(*native, s)
            plans.append((out, row, frames, size, rng))
        passes = []
        for size in dict.fromkeys(p[3] for p in plans):  # one pass per decode size
            group = [p for p in plans if p[3] == size]
            union = np.unique(np.concatenate([p[2].ravel() for p in group]))
            direct = None
            if len(group) == 1 and k == 1 and self.crop is None and np.array_equal(union, group[0][2][0]):
                # the clip is the union: decode straight into the slot
                direct = group[0][0]["video"][: len(union)]
            passes.append((size, group, union, direct))
        return v, info, passes


def _fill(clips: VideoClips, out: dict[str, np.ndarray], v: int, frames: np.ndarray, union: np.ndarray,
          decoded: np.ndarray, rng: np.random.Generator, done: bool) -> None:
    """Sample ``out`` of row ``v``: its clips (and crop windows) copied out of ``decoded``
    (the frames ``union``), unless ``done`` (decoded straight into the slot), and its fields.
    With ``max_frames``, the ``t = frames.shape[1]`` frames found fill the front of ``video``
    and the rest is padding: zeros, ``frames`` -1, ``mask`` False."""
    k, t = frames.shape
    m = clips.clip_len  # frames per clip in the batch: clip_len, or max_frames
    video = _view(out["video"], (k, clips.views // k, m, *out["video"].shape[-3:]))
    if not done:
        where = np.searchsorted(union, frames)  # [K, T] rows of `decoded`
        if clips.crop is None:
            for j in range(k):
                np.copyto(video[j, 0, :t], decoded[where[j]])
        else:
            ch, cw = clips.crop
            corners = crop_windows(decoded.shape[1], decoded.shape[2], clips.crop, clips.crop_at, k, rng)
            for j in range(k):
                for c, (y, x) in enumerate(corners[j]):
                    np.copyto(video[j, c, :t], decoded[where[j], y : y + ch, x : x + cw])
    if t < m:  # the slot holds an earlier batch's pixels: clear the padding
        video[:, :, t:] = 0
    padded = np.full((k, m), -1, np.int64)
    padded[:, :t] = frames
    out["label"][...] = -1 if clips.labels is None else clips.labels[v]
    out["index"][...] = v
    out["start"][...] = frames[:, 0].reshape(out["start"].shape)
    out["frames"][...] = padded.reshape(out["frames"].shape)
    if "mask" in out:
        out["mask"][...] = np.arange(m) < t


def _view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` seen with another shape; raises rather than copy (a copy would not reach the slot)."""
    b: np.ndarray = a.view()
    b.shape = shape
    return b


def _member_columns(rows: list[tuple[str, dict[str, Any]]]) -> dict[str, np.ndarray] | None:
    """Offsets and sizes of the tar members a manifest lists (its ``offset`` and ``bytes``
    columns); size -1 where a row does not say (the worker reads that shard's headers)."""
    if not any(split_member(p) and str(row.get("offset", "")).strip() for p, row in rows):
        return None
    offset, size = np.zeros(len(rows), np.int64), np.full(len(rows), -1, np.int64)
    for i, (p, row) in enumerate(rows):
        try:
            if split_member(p):
                offset[i], size[i] = int(row["offset"]), int(row["bytes"])
        except (KeyError, TypeError, ValueError):
            pass
    return {"offset": offset, "size": size}


def _shard_label(storage: Storage, shard: str, key: str, parts: dict[str, str], label_key: str) -> int:
    """The label of sample ``key`` of ``shard``: its ``.cls`` member, or a field of its ``.json``."""
    import json

    ext, _, field = label_key.partition(":")
    name = parts.get(ext)
    where = f"sample {key!r} of {storage.name(shard)}"
    if name is None:
        raise ValueError(f"{where} has no .{ext} member for its label (label_key={label_key!r}; None for no labels)")
    text = storage.read_text(member_url(name, shard))
    try:
        value = json.loads(text)[field] if field else text
        return int(value)
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{where}: the label in {name!r} is not an integer: {text[:80]!r}") from None


def _draw_scale(rng: np.random.Generator, scale: tuple[int, int]) -> int:
    lo, hi = scale
    return lo if lo == hi else int(rng.integers(lo, hi + 1))


def _native_size(path: str, storage: Storage) -> tuple[int, int]:
    """The first video's size as shown, read in the main process as a worker reads it."""
    from .probe import probe

    try:
        info = probe(path, storage=storage)
    except Exception as e:
        raise ValueError(f"size=None: cannot read the native size of {storage.name(path)!r}: "
                         f"{storage.redact(str(e))}") from e
    return info.height, info.width


def _seconds(manifest: str, n: int, cell: str | float | None) -> float | None:
    """A manifest's start or end cell in seconds; None when empty."""
    if cell is None or (isinstance(cell, str) and not cell.strip()):
        return None
    try:
        return float(cell)
    except (TypeError, ValueError):
        raise ValueError(f"{manifest!r} row {n}: a start or end must be seconds, got {cell!r}") from None


def _first_rows(paths: list[str]) -> np.ndarray:
    """For every row, the index of the first row with the same path."""
    first: dict[str, int] = {}
    return np.fromiter((first.setdefault(p, i) for i, p in enumerate(paths)), np.int64, len(paths))
