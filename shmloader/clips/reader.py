"""Reading a dataset's samples: sample ids in, arrays out, in any process.

A :class:`ClipReader` is made from a :class:`~shmloader.VideoClips` (which only
describes the dataset) and does what a ring worker does with it: the probe of each file (cached
per reader), the choice of decoder, the plan of a video's clips (``clips.sampling``), one decode
pass per video and size (``video.decoding``), and the arrays filled. ``read(samples)`` returns a
batch of fresh arrays — the fields of the loader's batches (``video``, ``label``, ``index``,
``start``, ``frames``, ``mask``) — without the ring, the shared tables or the engine: a Ray task
or a GPU decoder calls it as the ring's workers call ``read_into`` on slots. Sample ``i`` of
epoch ``e`` draws from the generator ``(seed, e, i)`` in both, so the same ids give the same
clips wherever they are read.

NOTE [ Where a probe comes from ]

One lookup, for ring workers and Ray tasks alike (``ClipReader._info``): the file's scan
manifest row while the file is unchanged; else the probe this reader keeps (``Decoding``, by the
file's size and mtime); else the one another worker of the loader published (``video.probestore``,
ring workers only); else probed here, and published. A worker that finds another probing the file
waits for its result, bounded by ``_PROBE_WAIT_S``; remote files of one task are probed together
(``_probe_ahead``), through the same steps.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ..engine.source import Spec, seeded
from ..video.audio import audio_spec, clip_spans
from ..video.manifest import row_info
from ..video.measuring import ChoiceLog, Cut, Measuring, measures
from ..video.media import split_member
from ..video.reading import Reading
from .options import Audio, Pixels, Sampling
from ..video.probe import UNORDERED, VideoInfo
from ..video.probestore import ProbeStore
from .sampling import SEGMENTS, clip_frames, crop_windows, rate_frames, scaled_size
from ..video.storage import Storage

__all__ = ["ClipReader", "Clips", "sample_spec"]

# How long a worker waits for another that is probing the same remote file before it probes the
# file itself (a probe's requests have their own deadlines; this only bounds the wait).
_PROBE_WAIT_S = 60.0


class Clips(Protocol):
    """What a reader reads of a dataset's description (``VideoClips``, which makes readers: the
    reader knows it only by these)."""

    labels: np.ndarray | None
    spans: np.ndarray | None
    files: np.ndarray | None
    manifest: dict[str, np.ndarray] | None
    members: dict[str, np.ndarray] | None
    storage: Storage
    remote: bool
    sampling: Sampling
    pixels: Pixels
    audio: Audio | None
    reading: Reading
    decode_size: tuple[int, int] | None
    audio_samples: int

    def __len__(self) -> int: ...

    @property
    def paths(self) -> Sequence[str]: ...  # a list, or in a worker the shared table

    @property
    def views(self) -> int: ...

    def spec(self) -> Spec: ...

    def describe(self, index: int) -> str: ...


class ClipReader:
    """Samples of ``clips`` read into arrays in this process (see the module's docstring).

    :param clips: the dataset's description.
    :param probes: the probes a loader's workers share (``video.probestore``); None elsewhere.
    :param choices: where the decoders measured per shape are told to the loader (``video.measuring``).
    """

    def __init__(self, clips: Clips, probes: ProbeStore | None = None, choices: ChoiceLog | None = None) -> None:
        self.clips = clips
        measuring = Measuring(cut_of(clips), choices) if measures(clips.reading.decoder, clips.remote) else None
        self.decoding = clips.reading.decoding(clips.storage, measuring)
        self._shared = probes
        # Frames a decoder goes through for each pass, from the keyframes it decodes from (all of
        # them, lead = those no clip shows, head = those before each pass's first frame) and the
        # frames those passes deliver (``Loader.stats``: frames decoded per delivered frame).

    def __reduce__(self) -> tuple[type, tuple[Any]]:
        """Pickled as its description alone (by value): the probes and open files it caches,
        and the shared probes' descriptor, belong to this process."""
        return (type(self), (self.clips,))

    def read(self, samples: Sequence[int], *, seed: int = 0, epoch: int = 0) -> dict[str, np.ndarray]:
        """Samples ``samples`` (ids ``0 .. len(clips) - 1``) as one batch ``{field: [n, ...]}`` of
        new arrays, drawn as a loader with ``seed`` draws them in ``epoch``."""
        ids = [int(s) for s in samples]
        for s in ids:
            if not 0 <= s < len(self.clips):
                raise IndexError(f"sample {s} is not among the {len(self.clips)} samples")
        batch = {k: np.zeros((len(ids), *shape), dtype) for k, (shape, dtype) in self.clips.spec().items()}
        outs = [{k: a[i, ...] for k, a in batch.items()} for i in range(len(ids))]
        self.read_into(ids, [seeded((seed, epoch, s)) for s in ids], outs, (seed, epoch))
        return batch

    def load_decoders(self) -> ClipReader:
        """Import the decoders these clips may use now (a worker, before it says READY): ~0.4 s
        that would otherwise count as its first task's decoding (NOTE [ Start-up is not work ]
        in ``engine.stats``). Returns this reader."""
        vc = self.clips
        for name in ("pyav",) if vc.reading.decoder == "pyav" or vc.remote else ("pyav", "decord"):
            self.decoding.decoder(name)
        return self

    def counters(self) -> dict[str, int]:
        """Decodes by decord and by PyAV, decodes decord handed to PyAV, probes read again (an
        index-read timeline found wrong), files probed, bytes and requests fetched from remote
        storage, and reads timed to measure the decoders and the shapes each was chosen for
        (NOTE [ Measuring the decoder ]) so far (``engine.protocol.COUNTS``)."""
        return self.decoding.counters()

    def _info(self, v: int, path: str) -> VideoInfo:
        """Video ``v`` as the probe sees it (NOTE [ Where a probe comes from ])."""
        row = self._manifest_row(v, path)
        if row is not None:
            return self.decoding.info(path, *row)
        shared = self._shared
        if shared is not None and not self._have(v, path):
            with shared.probing(v, _PROBE_WAIT_S) as mine:  # another worker may be probing it
                if not self._have(v, path):
                    info = self.decoding.info(path)
                    if mine:
                        shared.put(v, info)
                    return info
        return self.decoding.info(path)

    def _manifest_row(self, v: int, path: str) -> tuple[VideoInfo, tuple[int, int]] | None:
        """Row ``v`` of the scan manifest, if any, and the tar member's place the reader is told."""
        vc = self.clips
        members = vc.members
        member = split_member(path) if members is not None else None
        if members is not None and member is not None and members["size"][v] >= 0:  # no header is read
            vc.storage.add_members(member[1], {member[0]: (int(members["offset"][v]), int(members["size"][v]))})
        return None if vc.manifest is None else row_info(vc.manifest, v, path)

    def _have(self, v: int, path: str) -> bool:
        """Does this reader hold file ``v``'s probe: its own, or one taken from the shared ones?"""
        if self.decoding.kept(path) is not None:
            return True
        info = None if self._shared is None else self._shared.get(v)
        if info is not None:
            self.decoding.adopt(path, info)
        return info is not None

    def _probe_ahead(self, files: list[int]) -> None:
        """Probe the remote files ``files`` together (NOTE [ Where a probe comes from ]), but not
        those another worker has probed (taken from it) or is probing (``_info`` waits for it)."""
        vc, shared = self.clips, self._shared
        mine = [v for v in files if not self._have(v, vc.paths[v]) and (shared is None or shared.try_probing(v))]
        try:
            self.decoding.probe_ahead([vc.paths[v] for v in mine])
            if shared is not None:
                for v in mine:
                    info = self.decoding.kept(vc.paths[v])
                    if info is not None:
                        shared.put(v, info)
        finally:
            if shared is not None:
                for v in mine:
                    shared.release(v)

    def read_into(self, indices: list[int], rngs: list[np.random.Generator],
                  outs: list[dict[str, np.ndarray]], epoch_key: tuple[int, int] | None = None) -> None:
        """Write samples ``indices`` into ``outs``, one decode pass per video and scale.

        ``epoch_key=(seed, epoch)`` seeds what the samples of one video share in an epoch with
        ``group_clips`` (the scale), so grouping never changes what a sample holds.
        """
        vc = self.clips
        per_video = vc.sampling.clips_per_video
        by_file: dict[int, list[int]] = {}
        for i, index in enumerate(indices):
            v = index // per_video
            by_file.setdefault(v if vc.files is None else int(vc.files[v]), []).append(i)
        remote = vc.remote  # decided once, when the paths were given
        if remote and len(by_file) > 1:  # their probes' requests together, not one after another
            self._probe_ahead(list(by_file))
        plans = [self._plan_video(v, [(indices[i] // per_video, indices[i] % per_video, rngs[i], outs[i])
                                      for i in items], epoch_key)
                 for v, items in by_file.items()]
        if remote:  # every clip's bytes in one round of requests (NOTE [ Reading remote files ])
            # the audio's too where the probe placed its packets (video.audiobytes)
            self.decoding.prefetch([(info, union, None if info.audio_packets is None else
                                     self._spans(info, [(g[2], g[1]) for g in group]))
                                    for _, info, passes in plans for _, group, union, _ in passes])
        for v, info, passes in plans:
            for size, group, union, direct in passes:
                decoded = self.decoding.decode(info, size, union, direct)
                self.decoding.count(union, self.decoding.keyframes(info), sum(g[2].size for g in group))
                for out, row, frames, _, rng, starts in group:
                    _fill(self.clips, out, row, frames, union, decoded, rng, done=decoded is direct, starts=starts)
                if vc.audio is not None:
                    self._audio(info, [(g[2], g[0], g[1]) for g in group])

    def _audio(self, info: VideoInfo, samples: list[tuple[np.ndarray, dict[str, np.ndarray], int]]) -> None:
        """The audio of every clip of ``samples`` = [(frames [K, T], out, row)...] of one video,
        read together (NOTE [ Where a clip's audio lies ]): a whole-video sample's span is cut to
        its row's span and to ``S`` samples."""
        vc = self.clips
        assert vc.audio is not None, "read with audio only"
        outs = []
        for frames, out, _ in samples:
            k = frames.shape[0]
            audio = _view(out["audio"], (k, vc.audio_samples, vc.audio.channels))
            lens = _view(out["audio_len"], (k,))
            outs += [(audio[j], lens[j, ...]) for j in range(k)]
        spans = self._spans(info, [(frames, row) for frames, _, row in samples])
        assert spans is not None
        self.decoding.audio(info, spans, vc.audio.rate, outs)

    def _spans(self, info: VideoInfo, clips: list[tuple[np.ndarray, int]]) -> np.ndarray | None:
        """``[K, 2]`` seconds on the container's timeline that the clips of ``clips`` =
        [(frames [k, T], row)...] span, in order: what their audio is read for (a whole-video
        sample's cut to its row's span and to ``S`` samples); None without audio."""
        vc = self.clips
        if vc.audio is None:
            return None
        whole = vc.sampling.whole_video
        longest = vc.audio_samples / vc.audio.rate if whole else None
        times, at = self.decoding.timeline(info)
        spans = []
        for frames, row in clips:
            within = None if vc.spans is None or not whole else (float(vc.spans[row][0]), float(vc.spans[row][1]))
            spans.append(clip_spans(times, frames, within=within, longest=longest) + at)
        return np.concatenate(spans)

    def _plan_video(self, v: int, items: list[tuple[int, int, np.random.Generator, dict[str, np.ndarray]]],
                    epoch_key: tuple[int, int] | None) -> tuple[int, VideoInfo, list[Any]]:
        """What the samples ``items`` = [(row, clip, rng, out)] of the rows of file ``v`` take:
        ``(v, info, passes)``, a pass per decode size: ``(size, [(out, row, frames [K, T], size,
        rng, every frame's start in seconds)...], union of their frames, the slot to decode into
        directly or None)``."""
        vc, sm, px = self.clips, self.clips.sampling, self.clips.pixels
        path, k = vc.paths[v], sm.clips_per_sample
        info = self._info(v, path)
        n = info.frames
        pts = None
        if sm.fps is not None or sm.mode in SEGMENTS or vc.spans is not None:
            pts = info.times()
            if pts is None:  # a manifest row of a variable-rate video: read the timestamps
                pts = self.decoding.info(path).times()
        starts = _starts(info, pts, lambda: self.decoding.timed(path))
        native = (info.height, info.width)
        size = vc.decode_size
        if px.native and size is not None and native != tuple(size):
            raise ValueError(f"video is {native[0]}x{native[1]} but the loader's clips are "
                             f"{size[0]}x{size[1]}; pass size=(height, width) to resize, or crop=")
        fixed = None if px.native else size  # decode size unless scaled per video
        scale = px.short_side
        shared_scale = None
        if scale is not None and vc.reading.group_clips and epoch_key is not None:
            shared_scale = _draw_scale(np.random.default_rng((*epoch_key, v, 1)), scale)
        plans = []  # (out, row, frames [K, T], decode size, rng) per sample
        for row, c, rng, out in items:
            span = None if vc.spans is None else (float(vc.spans[row][0]), float(vc.spans[row][1]))
            if sm.max_frames is not None:
                assert sm.fps is not None, "max_frames comes with fps"
                frames = rate_frames(n, pts, fps=sm.fps, max_frames=sm.max_frames, sampling=sm.mode,
                                     short_video=sm.short_video, rng=rng, span=span)[None]
            else:
                frames = clip_frames(n, pts, clip_len=sm.length, frame_step=sm.frame_step, fps=sm.fps,
                                     sampling=sm.mode, clips=[c * k + j for j in range(k)],
                                     total_clips=sm.clips_per_video * k, short_video=sm.short_video, rng=rng,
                                     span=span)
            size = fixed
            if scale is not None:
                s = shared_scale if shared_scale is not None else _draw_scale(rng, scale)
                size = scaled_size(*native, s)
            plans.append((out, row, frames, size, rng, starts))
        passes = []
        for size in dict.fromkeys(p[3] for p in plans):  # one pass per decode size
            group = [p for p in plans if p[3] == size]
            union = np.unique(np.concatenate([p[2].ravel() for p in group]))
            direct = None
            if len(group) == 1 and k == 1 and px.crop is None and np.array_equal(union, group[0][2][0]):
                # the clip is the union: decode straight into the slot
                direct = group[0][0]["video"][: len(union)]
            passes.append((size, group, union, direct))
        return v, info, passes


def sample_spec(clips: Clips) -> Spec:
    """The fields of a sample of ``clips`` (``VideoClips.spec``): shapes and dtypes."""
    shape = clips.pixels.crop or clips.decode_size
    assert shape is not None, "the constructor fixes a crop or a size"
    h, w = shape
    k, t, v = clips.sampling.clips_per_sample, clips.sampling.length, clips.views
    scalar = ((), np.dtype(np.int64))
    lead = () if k == 1 else (k,)
    spec: Spec = {"video": ((t, h, w, 3) if v == 1 else (v, t, h, w, 3), np.dtype(np.uint8)),
                  "label": scalar, "index": scalar, "start": (lead, np.dtype(np.int64)),
                  "frames": ((*lead, t), np.dtype(np.int64)), "times": ((*lead, t), np.dtype(np.float64))}
    if clips.sampling.max_frames is not None:  # up to max_frames frames: which are real
        spec["mask"] = ((t,), np.dtype(np.bool_))
    if clips.audio is not None:
        spec.update(audio_spec(k, clips.audio_samples, clips.audio.channels))
    return spec


def cut_of(clips: Clips) -> Cut:
    """What ``clips``' reader reads of each file, as a decoder measurement is for it."""
    sm, px = clips.sampling, clips.pixels
    size = clips.decode_size
    scale = px.short_side
    what = (f"short side {scale[0]}" + ("" if scale[0] == scale[1] else f"-{scale[1]}") if scale is not None else
            "native" if size is None else f"{size[0]}x{size[1]}")
    together = sm.clips_per_sample * (sm.clips_per_video if clips.reading.group_clips else 1)
    return Cut(what, sm.length, 0 if sm.fps is not None else sm.frame_step, together)


def _starts(info: VideoInfo, pts: np.ndarray | None, probed: Callable[[], VideoInfo]
            ) -> Callable[[np.ndarray], np.ndarray]:
    """Frames' starts in seconds from the first frame's, by the file's timestamps (``times``), for
    the frames asked (no table of every frame built per sample); a video known by a manifest row
    alone whose rate is not constant is probed (``probed()``) for them, once asked (after its
    frames decoded); NaN for a stream that has none (a raw H.264 stream)."""
    if pts is not None:
        return lambda frames: pts[frames, 0] - pts[0, 0]
    timer: list[Callable[[np.ndarray], np.ndarray]] = []

    def at(frames: np.ndarray) -> np.ndarray:
        if not timer:
            timer.append(_timer(info, probed))
        return timer[0](frames)

    return at


def _timer(info: VideoInfo, probed: Callable[[], VideoInfo]) -> Callable[[np.ndarray], np.ndarray]:
    for known in (info, None):  # as VideoInfo.times() times them
        if known is None:
            if info.pts is not None:  # probed already: it has no usable timestamps
                break
            known = probed()
        if known.pts is not None and known.durations is not None:
            stamps, unit = known.pts, float(known.time_base)
            return lambda frames: (stamps[frames] - stamps[0]).astype(np.float64) * unit
        if known.pts is None and known.problem in ("", UNORDERED) and known.fps > 0:
            fps = known.fps
            return lambda frames: frames / fps
    return lambda frames: np.full(np.shape(frames), np.nan)


def _fill(clips: Clips, out: dict[str, np.ndarray], v: int, frames: np.ndarray, union: np.ndarray,
          decoded: np.ndarray, rng: np.random.Generator, done: bool,
          starts: Callable[[np.ndarray], np.ndarray]) -> None:
    """Sample ``out`` of row ``v``: its clips (and crop windows) copied out of ``decoded``
    (the frames ``union``), unless ``done`` (decoded straight into the slot), and its fields.
    With ``max_frames``, the ``t = frames.shape[1]`` frames found fill the front of ``video``
    and the rest is padding: zeros, ``frames`` -1, ``times`` NaN, ``mask`` False."""
    k, t = frames.shape
    m = clips.sampling.length  # frames per clip in the batch: clip_len, or max_frames
    video = _view(out["video"], (k, clips.views // k, m, *out["video"].shape[-3:]))
    if not done:
        where = np.searchsorted(union, frames)  # [K, T] rows of `decoded`
        crop = clips.pixels.crop
        if crop is None:
            for j in range(k):
                np.copyto(video[j, 0, :t], decoded[where[j]])
        else:
            ch, cw = crop
            corners = crop_windows(decoded.shape[1], decoded.shape[2], crop, clips.pixels.crop_at, k, rng)
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
    out["times"][...] = np.where(padded >= 0, starts(np.maximum(padded, 0)), np.nan).reshape(out["times"].shape)
    if "mask" in out:
        out["mask"][...] = np.arange(m) < t


def _view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` seen with another shape; raises rather than copy (a copy would not reach the slot)."""
    b = a.reshape(shape)
    if not np.may_share_memory(a, b):
        raise ValueError(f"an array of shape {a.shape} cannot be seen as {shape} without a copy")
    return b


def _draw_scale(rng: np.random.Generator, scale: tuple[int, int]) -> int:
    lo, hi = scale
    return lo if lo == hi else int(rng.integers(lo, hi + 1))
