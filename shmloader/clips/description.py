"""VideoClips: clips of ``clip_len`` frames decoded inside the workers.

What a video holds (its frame count, timestamps, size as shown) comes from ``video.probe``, the
presentation timeline libavformat gives; the frames come from decord or PyAV (``video.decord``,
``video.pyav``), chosen per file. Neither is imported here: the main process probes only the
first video, when ``size=None`` asks for the native size.

Every sample's clips are decoded in one pass: the worker works out all their frames first
(``clips.sampling``), and its reader (``clips.reader``) asks the file's decoder, decord or PyAV,
for the sorted union of them at once, then copies each clip (and crop window) out of that, so
each stretch of the video is decoded once rather than from the previous keyframe for every
clip (NOTE [ Decoding less, exactly ]). The same holds across samples: a worker handed several
samples of one video (see ``group_clips`` and ``engine.schedule``) decodes them all in one pass.
"""

from __future__ import annotations

import hashlib
import os
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..engine.shared import SharedStrings
from ..engine.source import Spec
from ..video.arguments import check_spans, checked_labels, checked_paths, columns, path_list, read_only
from ..video.identity import digest
from .arguments import FirstVideo, audio_samples, class_videos, first_rows
from .listing import SHARD_VIDEO_KEYS, csv_listing, shard_listing
from ..video.manifest import MANIFEST_INTS, VIDEO_EXTENSIONS, class_folders
from .options import GROUPS, Audio, OptionKeywords, Pixels, Reading, Sampling, flat, merged
from .reader import ClipReader, sample_spec
from .tables import SharedClips

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["VideoClips", "digest"]

# Columns of a scan manifest a reader takes instead of probing (``video.manifest.row_info``), and
# of tar members' places (``from_shards``).
MANIFEST_COLUMNS = (*MANIFEST_INTS, "fps", "decoder", "cfr")
MEMBER_COLUMNS = ("offset", "size")
# What a description is given besides its paths and options: a column (or list) per path.
_ROWS = ("labels", "spans", "manifest", "members", "classes")


class VideoClips:
    """Clips from video files, decoded in the workers.

    Each sample, with ``K = clips_per_sample`` clips and ``V`` views (``K``, or ``3 * K`` with
    ``crop_at="three"``): ``video`` uint8 ``[T, H, W, 3]`` when ``V == 1``, else
    ``[V, T, H, W, 3]`` (view ``k * 3 + c`` is clip ``k``, crop ``c``); ``frames`` int64
    ``[T]`` (``[K, T]``), the index in the video of every delivered frame; ``start`` int64
    (``[K]``), each clip's first frame; ``label`` int64 (-1 without labels); ``index`` int64,
    the video's position in ``paths``; with audio, ``audio`` and ``audio_len`` (:class:`Audio`).
    There are ``len(paths) * clips_per_video`` samples.

    The options come in four groups, each field documented once there: which frames
    (:class:`Sampling`), which pixels (:class:`Pixels`), the sound (:class:`Audio`) and how the
    files are read (:class:`Reading`). Give a field by its keyword (``clip_len=8``,
    ``sampling="uniform"``, ``size=(112, 112)``, ``audio_rate=16000``, ``fetch={...}``), or a
    group whole (``sampling=Sampling(clip_len=8, mode="uniform")``, ``pixels=Pixels(...)``), but
    not both for one group. Each is read back as ``clips.sampling.clip_len``, ``clips.pixels.crop``,
    ``clips.audio.rate`` (``clips.audio`` is None without sound), ``clips.reading.decoder``.

    Where the videos live: ``paths`` are local files or fsspec URLs (``s3://``, ``gs://``,
    ``az://``, ``https://``, ``hf://``, members of tar shards as ``tar://key.mp4::<shard URL>``;
    the protocol's package is an extra, e.g. ``shmloader[s3]``), read as :class:`Reading` says.

    :param paths: video files, fsspec URLs or tar members (``tar://key.mp4::<shard>``).
    :param labels: an integer per path (``label`` is -1 without them).
    :param sampling: which frames, a :class:`Sampling`; or its ``mode``, a string.
    :param pixels: which pixels, a :class:`Pixels`.
    :param audio: the sound, an :class:`Audio`; None: none.
    :param reading: how the files are read, a :class:`Reading`.
    :param spans: per path ``(start, end)`` seconds (None: open) the clips must lie in.
    :param manifest: a scan manifest's probe columns, one row per path (``from_csv``).
    :param members: tar members' ``offset`` and ``size`` per path, -1 where unknown (``from_shards``).
    :param classes: the class names, label ``i`` is ``classes[i]`` (``from_folder``).
    :param options: any field of the groups by its keyword.
    :raises ValueError: a bad argument, naming it.

    A ``VideoClips`` is a description and does not change once made (``with_options`` makes a
    changed copy); each loader keeps what it needs to run it (``for_workers``).
    """

    sampling: Sampling
    pixels: Pixels
    audio: Audio | None
    reading: Reading

    def __init__(self, paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None, *,
                 sampling: str | Sampling | None = None, pixels: Pixels | None = None, audio: Audio | None = None,
                 reading: Reading | None = None, spans: Sequence[tuple[float | None, float | None]] | None = None,
                 manifest: Mapping[str, np.ndarray] | None = None, members: Mapping[str, np.ndarray] | None = None,
                 classes: Sequence[str] | None = None, **options: Unpack[OptionKeywords]) -> None:
        given = path_list(paths)
        if not given:
            raise ValueError("paths is empty")
        whole = {"sampling": sampling, "pixels": pixels, "audio": audio, "reading": reading}
        groups = merged({}, {**{k: v for k, v in whole.items() if v is not None}, **options})
        for g, value in groups.items():
            setattr(self, g, value)
        times = check_spans(spans, len(given))
        codes = None if labels is None else checked_labels(labels, len(given))
        self.storage = self.reading.storage()
        resolved, remote = checked_paths(given, self.reading.allow_urls)
        if remote and self.reading.decoder == "decord":
            raise ValueError("decoder='decord' reads local files only; remote paths are read by PyAV "
                             "(decoder='auto' or 'pyav')")
        self.paths = resolved
        self.remote = remote  # any path read through fsspec: decided here, never asked again
        self.labels = codes
        self.spans = times  # [n, 2] seconds from each video's first frame, or None
        # Rows of one file (several spans of a video): the first row's index, so that a worker
        # handed several of them decodes the file once (read_many).
        self.files = None if times is None else first_rows(resolved)
        first = FirstVideo(self.paths[0], self.storage)  # probed here when asked, once
        # The size every frame is decoded at, where one serves all: the given size, or without a
        # crop the first video's native size, which every video must then have; None: each
        # video's own (scaled, or cropped from native frames of any size at least the crop).
        px = self.pixels
        self.decode_size = first.native_size() if px.native and px.crop is None else px.size
        self.audio_samples = audio_samples(self.sampling, self.audio, first)  # S, 0 without audio
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
        reading = kwargs.get("reading") or Reading(storage_options=storage_options, fetch=fetch)
        listed = shard_listing(urls, video_key, label_key, reading.storage())
        given = {"storage_options": storage_options, "fetch": fetch}
        kwargs.update({k: v for k, v in given.items() if v is not None})
        return cls(listed.paths, listed.labels, members=listed.members, **kwargs)

    def options(self) -> dict[str, Any]:
        """The constructor's keyword arguments that made this source (paths aside): every option
        by its keyword, and the columns given per path."""
        return dict(labels=self.labels, spans=None if self.spans is None else self.spans.tolist(),
                    manifest=self.manifest, members=self.members, classes=self.classes, **flat(self._groups()))

    def with_options(self, **changes: Any) -> VideoClips:
        """A copy with some constructor arguments changed, e.g. ``sampling="uniform"`` for
        evaluation, ``audio_rate=None`` (no sound) or a group whole (``pixels=Pixels(...)``)."""
        current = self.options()
        rows = {k: changes.pop(k, current[k]) for k in _ROWS}
        return type(self)(self.paths, **rows, **merged(self._groups(), changes))

    def for_eval(self) -> VideoClips:
        """The same clips made deterministic for evaluation: ``sampling="uniform"`` instead of
        random starts (``"segments_uniform"`` instead of ``"segments"``: each segment's centre),
        the short side ``S_min`` of a ``scale`` range, ``crop_at="center"`` instead of random
        windows (``"three"`` stays)."""
        s, p = self.sampling.for_eval(), self.pixels.for_eval()
        return self if s is self.sampling and p is self.pixels else self.with_options(sampling=s, pixels=p)

    def _groups(self) -> dict[str, Any]:
        return {g: getattr(self, g) for g in GROUPS}

    def __len__(self) -> int:
        return len(self.paths) * self.sampling.clips_per_video

    def fingerprint(self) -> str:
        """A hash of the videos, in order, and their labels, which a loader's saved state carries."""
        return self._digest

    @cached_property
    def _digest(self) -> str:  # cached_property writes the instance's dict: no __setattr__
        return _fingerprint(self.paths, self.labels)

    @property
    def views(self) -> int:
        """Views per sample: clips, times three with ``crop_at="three"``."""
        return self.sampling.clips_per_sample * (3 if self.pixels.crop_at == "three" else 1)

    @property
    def group_size(self) -> int:
        """Consecutive sample indices the loader may hand to one worker to decode in one pass
        (with rows sharing a video, see ``group_ids``: the mean samples per video, rounded up)."""
        if not self.reading.group_clips:
            return 1
        ids = self.group_ids()
        return self.sampling.clips_per_video if ids is None else -(-len(ids) // (int(ids.max()) + 1))

    def group_ids(self) -> np.ndarray | None:
        """With ``group_clips`` and several rows (spans) of one video: the video of each sample
        (0, 1, ... in order of first appearance), so that the loader groups every sample of a
        video, of all its rows; else None (groups are ``group_size`` consecutive samples)."""
        if not self.reading.group_clips or self.files is None or np.array_equal(self.files, np.arange(len(self.files))):
            return None
        _, dense = np.unique(self.files, return_inverse=True)
        return np.repeat(dense.astype(np.int64), self.sampling.clips_per_video)

    def spec(self) -> Spec:
        return sample_spec(self)

    def describe(self, index: int) -> str:
        v, c = divmod(index, self.sampling.clips_per_video)
        name = repr(self.storage.name(self.paths[v]))
        return f"{name}, clip {c}" if self.sampling.clips_per_video > 1 else name

    def reader(self) -> ClipReader:
        """A reader of these samples in this process: ``reader().read([0, 5, 9])`` gives their
        arrays as a loader's batch holds them (``clips.reader``), with no loader running."""
        return ClipReader(self)

    def for_workers(self) -> SharedClips:
        """What one loader's workers run for these clips (its columns shared, its workers' probes
        shared): the loader that asks owns it (``clips.tables``)."""
        return SharedClips(self, self._encoded)


def _fingerprint(paths: list[str], labels: np.ndarray | None) -> str:
    """``VideoClips.fingerprint``: a loader over other videos, or other labels, refuses the state."""
    h = hashlib.sha256("\0".join(paths).encode("utf-8", "surrogateescape"))
    h.update(b"" if labels is None else np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]
