"""What a worker holds to decode: the probe of each file (cached), the choice of decoder per file
(the probe's, or the user's ``decoder=``), and what decord was found unable to do on this
machine — a decode size whose row alignment decord cannot copy out (it depends on the CPU's
SIMD), found by behaviour once per worker and width, never from a list. Those go to PyAV, whose
pixels equal decord's at every size where decord works (the same scaler and flags). Given a
``Measuring`` (a ``ClipReader``'s, with ``decoder="auto"``), a file both decoders read exactly
goes to the one measured faster for its shape (NOTE [ Measuring the decoder ] in
``video.measuring``), the probe's choice until then.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import replace
from typing import cast

import numpy as np

from ..engine.native_log import damage_seen
from .audio import read_audio
from .audiobytes import audio_only, audio_ranges
from .decoders import DecoderLimit, FrameSink
from .decord import Decord
from .measuring import Measuring, Shape, decode_cost, measurable, timed
from .probe import VideoInfo, probe
from .pyav import PyAV, OffTimeline, byte_ranges
from .storage import LOCAL, Storage, first_line

__all__ = ["Decoding"]

# Probes a worker keeps, counted in frames (their timestamps take 24 bytes a frame; a remote MP4's
# audio packets, as many bytes each, count as frames): a worker revisits a video every epoch, and
# re-reading its packets costs ~5-10 ms.
_PROBED_FRAMES = 2_000_000
# Probes kept for timestamps alone (``timed``): a worker's recent variable-rate manifest rows.
_TIMED_KEPT = 16
# A stretch of audio bytes more than this share of the block cache is not fetched ahead (a
# whole-video sample's sound spans the file): its first blocks would leave the cache before the
# demuxer reads them, and be fetched twice. The demuxer reads it as it goes.
_AUDIO_CACHE_SHARE = 1 / 4


class Decoding:
    """A worker's decoders: the probe of each file (cached), the choice per file, and the
    sizes decord was found unable to produce on this CPU (sent to PyAV from then on)."""

    def __init__(self, threads: int, choice: str = "auto", storage: Storage = LOCAL,
                 measuring: Measuring | None = None) -> None:
        self._threads = threads
        self._choice = choice
        self.storage = storage
        self.measuring = measuring if choice == "auto" else None  # None: the probe's choice stands
        self._decoders: dict[str, Decord | PyAV] = {}
        self._probes: OrderedDict[str, tuple[tuple[int, int], VideoInfo]] = OrderedDict()
        self._probed_frames = 0
        self._timed: OrderedDict[str, tuple[tuple[int, int], VideoInfo]] = OrderedDict()
        self.unsupported: set[int] = set()  # output widths decord fails to copy out on this CPU
        self.fallbacks = 0  # decodes sent to PyAV after decord refused
        self.decodes: Counter = Counter()  # decode calls by the decoder that gave the frames
        self.reprobes = 0  # index-read timelines found wrong while decoding
        self.probes = 0  # files probed (a valid manifest row, or a kept probe, spares one)
        # frames decoded (with those before the first wanted, back to its keyframe: the lead), the
        # decoded ones before a sample's first frame (the head), and those delivered
        self.frames = dict.fromkeys(("frames_decoded", "frames_lead", "frames_head", "frames_delivered"), 0)

    def counters(self) -> dict[str, int]:
        """What every family's reader reports of its decoding (``engine.protocol.COUNTS``): decodes
        by decord and by PyAV, decodes decord handed to PyAV, probes read again (an index-read
        timeline found wrong), files probed, bytes and requests fetched from remote storage, and
        where the decoder is measured the reads timed and the shapes each decoder was chosen for."""
        m = self.measuring
        measured = {} if m is None else {"measured_reads": m.reads, "chose_decord": m.chosen["decord"],
                                         "chose_pyav": m.chosen["pyav"]}
        return {"decord": self.decodes["decord"], "pyav": self.decodes["pyav"], "decoder_fallbacks": self.fallbacks,
                "reprobes": self.reprobes, "probes": self.probes, **self.storage.counters(), **measured, **self.frames}

    def count(self, union: np.ndarray, keyframes: np.ndarray, delivered: int) -> None:
        """A decode pass over frames ``union`` of a file with ``keyframes`` gave ``delivered``
        frames: what it decoded, for ``stats()``'s frames decoded per frame delivered."""
        decoded, head = decode_cost(union, keyframes)
        f = self.frames
        f["frames_decoded"] += decoded
        f["frames_lead"] += decoded - len(union)
        f["frames_head"] += head
        f["frames_delivered"] += delivered

    def decoder(self, name: str) -> Decord | PyAV:
        d = self._decoders.get(name)
        if d is None:
            d = self._decoders[name] = Decord(self._threads) if name == "decord" else PyAV(self._threads, self.storage)
        return d

    def close_file(self, path: str) -> None:
        """Close what is kept open of ``path`` for a next read (PyAV's container, and its
        decoder's frames: tens of MB at 720p), where none is due soon: a whole video is read
        once an epoch."""
        pyav = self._decoders.get("pyav")
        if pyav is not None:
            cast(PyAV, pyav).forget(path)

    def keyframes(self, info: VideoInfo) -> np.ndarray:
        """The keyframes a pass over ``info``'s file decoded from: the probe's; else (a scan
        manifest's row) those decord's index gave where decord read it, or frame 0 alone, where
        PyAV, knowing none, decodes from."""
        if info.keyframes is not None and len(info.keyframes):
            return info.keyframes
        d = self._decoders.get("decord")
        found = None if d is None else cast(Decord, d).keyframes.get(info.path)
        return found if found is not None and len(found) else np.zeros(1, np.int64)

    def info(self, path: str, known: VideoInfo | None = None, stamp: tuple[int, int] | None = None) -> VideoInfo:
        """The probe of ``path``: ``known`` (a manifest row) while the file's (size, mtime_ns)
        is still ``stamp``, else read once per worker while the file stays unchanged. The file
        is resolved once here (``Storage.resolve``); the info carries that handle down."""
        media = self.storage.resolve(path)
        now = media.stamp
        if known is not None and stamp == now:
            return replace(known, media=media)
        hit = self._probes.get(path)
        if hit is not None and hit[0] == now:
            self._probes.move_to_end(path)
            return hit[1]
        info = probe(media, storage=self.storage)
        self.probes += 1
        self._keep(path, now, info)
        return info

    def timed(self, path: str) -> VideoInfo:
        """A probe of ``path`` for its frames' timestamps alone (``times`` of a manifest row whose
        rate is not constant), kept apart from the probes that choose a decoder: the row's
        decoder still reads it. The last few are kept."""
        media = self.storage.resolve(path)
        for kept in (self._probes, self._timed):  # PyAV's decode probed it already, or an earlier time
            hit = kept.get(path)
            if hit is not None and hit[0] == media.stamp and hit[1].pts is not None:
                return hit[1]
        info = probe(media, storage=self.storage, index=False)
        self.probes += 1
        self._timed[path] = (media.stamp, info)
        while len(self._timed) > _TIMED_KEPT:
            self._timed.popitem(last=False)
        return info

    def kept(self, path: str) -> VideoInfo | None:
        """The probe of ``path`` this worker keeps, if any (whether still current or not)."""
        hit = self._probes.get(path)
        return None if hit is None else hit[1]

    def adopt(self, path: str, info: VideoInfo) -> None:
        """Keep ``info``, probed by another worker of the loader, as if probed here: ``info``
        serves while the file's stamp is the one it was probed at (``info.media``)."""
        if info.media is not None:
            self.storage.seen(info.media)
            self._keep(path, info.media.stamp, info)

    def _keep(self, path: str, stamp, info: VideoInfo) -> None:
        if path in self._probes:
            self._forget(path)
        n = _weight(info)
        if n <= _PROBED_FRAMES:
            self._probes[path] = (stamp, info)
            self._probed_frames += n
            while self._probed_frames > _PROBED_FRAMES:
                self._forget(next(iter(self._probes)))

    def probe_ahead(self, paths: list[str]) -> None:
        """Probe the remote files ``paths`` not probed yet, together (threads: each waits on its
        requests); a file that fails is left for ``info`` to report."""
        todo = [p for p in dict.fromkeys(paths) if p not in self._probes]
        if len(todo) < 2:
            return

        def one(path):
            try:
                media = self.storage.resolve(path)
                return path, media.stamp, probe(media, storage=self.storage)
            except Exception:
                return None

        for got in self.storage.map(one, todo):
            if got is not None:
                self.probes += 1
                self._keep(*got)

    def prefetch(self, wanted: list[tuple[VideoInfo, np.ndarray, np.ndarray | None]]) -> None:
        """Fetch the bytes that decoding ``frames`` of each remote video reads, and reading the
        audio of ``spans`` (``[K, 2]`` seconds, as ``audio`` is given them; None: no audio), all
        at once."""
        self.storage.prefetch_many([(info.media, byte_ranges(info, frames) + self._audio_ranges(info, spans))
                                    for info, frames, spans in wanted
                                    if info.spans is not None and info.media is not None and len(frames)])

    def timeline(self, info: VideoInfo) -> tuple[np.ndarray, float]:
        """``([frames, 2]`` (start, end) seconds of every frame, the seconds to add to put them
        on the container's timeline): the probe's timestamps, read from the file where ``info``
        is a manifest row; a video timed by its frame rate (AVI in decode order) from its
        stream's start."""
        if info.pts is None:
            info = self.info(info.path)
        times = info.times()
        if info.pts is not None and times is not None:
            return times, 0.0
        if times is None:
            raise ValueError(f"no timestamps or frame rate to place the audio by ({info.problem})")
        return times, cast(PyAV, self.decoder("pyav")).video_start(info)

    def audio(self, info: VideoInfo, spans: np.ndarray, rate: int, outs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """The audio of ``spans`` (``[K, 2]`` seconds on the container's timeline) read by PyAV
        from the file's first audio stream, whichever decoder gave the frames (``video.audio``)."""
        pyav = cast(PyAV, self.decoder("pyav"))
        ranges = self._audio_ranges(info, spans)
        if ranges and info.media is not None:
            self.storage.prefetch(info.media, ranges)  # cached already from a task's prefetch
        try:
            c = pyav.container(info)
            with audio_only(c):
                read_audio(c, spans, rate, outs)
        except Exception:
            pyav.forget(info.path)  # its demuxer may be left anywhere
            raise

    def _audio_ranges(self, info: VideoInfo, spans: np.ndarray | None) -> list[tuple[int, int]]:
        """The bytes reading the audio of ``spans`` reads, where the probe placed the audio's
        packets (a remote MP4/MOV: ``video.audiobytes``), less the stretches too large to fetch
        ahead (``_AUDIO_CACHE_SHARE``)."""
        if spans is None or info.audio_packets is None:
            return []
        most = self.storage.cache_bytes * _AUDIO_CACHE_SHARE
        return [(lo, hi) for lo, hi in audio_ranges(info.audio_packets, spans) if hi - lo <= most]

    def _forget(self, path: str) -> None:
        _, info = self._probes.pop(path)
        self._probed_frames -= _weight(info)

    def _full_probe(self, info: VideoInfo) -> VideoInfo:
        """``info`` read again from every packet (its index-read timeline proved wrong), kept."""
        full = probe(info.media or info.path, index=False, storage=self.storage)
        if full.decoder == "decord" and info.decoder == "pyav":
            full = full.with_decoder("pyav")
        self.reprobes += 1
        self._remember(full)
        return full

    def _remember(self, info: VideoInfo) -> None:
        if info.path in self._probes:
            stamp, _ = self._probes[info.path]
            self._probes[info.path] = (stamp, info)

    def decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
        """Frames ``frames`` (ascending, unique) of the video at ``size`` (None: as shown), in
        ``out`` where it has their shape."""
        return cast(np.ndarray, self._decode(info, size, frames, out))

    def decode_to(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray, sink: FrameSink) -> None:
        """``decode``, each frame handed to ``sink`` as it comes out (``video.decoders.FrameSink``)."""
        self._decode(info, size, frames, sink)

    def _decode(self, info: VideoInfo, size: tuple[int, int] | None, frames: np.ndarray,
                out: np.ndarray | FrameSink | None) -> np.ndarray | FrameSink:
        name = info.decoder if self._choice == "auto" else self._choice
        if info.media is not None and info.media.remote:
            name = "pyav"  # decord reads whole local files only (refused up front for decoder="decord")
        hit = self._probes.get(info.path)
        if hit is not None and hit[1].decoder == "pyav" != info.decoder and self._choice == "auto":
            info = hit[1]  # decord refused this file earlier: PyAV reads it (a pyav row stays PyAV's)
            name = info.decoder
        width = info.width if size is None else size[1]
        measured: Shape | None = None  # the shape this read is timed for
        if self.measuring is not None and width not in self.unsupported and measurable(info):
            name, measured = self.measuring.pick(info)
        refused = None
        if name == "decord" and (self._choice == "decord" or width not in self.unsupported):
            seen = damage_seen()
            try:
                got, cpu = timed(lambda: self.decoder("decord").decode(info, size, frames, out))
                if damage_seen() == seen or self._choice == "decord":
                    self.decodes["decord"] += 1
                    self._measured(measured, "decord", cpu, frames, info)
                    return got
                # FFmpeg complained about the bitstream inside decord, which then may return a
                # neighbouring frame for a damaged one: PyAV, which marks damaged frames, decides.
                self.fallbacks += 1
            except DecoderLimit:
                if self._choice == "decord":
                    raise
                self.unsupported.add(width)
                self.fallbacks += 1
            except cast(Decord, self.decoder("decord")).Error as e:
                if self._choice == "decord":
                    raise
                # decord refuses a file libavformat opened: PyAV reads it from now on.
                refused = e
                info = info.with_decoder("pyav", f"decord refuses it: {first_line(e, 160)}")
                self._remember(info)
                self.fallbacks += 1
        try:
            if info.pts is None:  # a manifest row: PyAV seeks by the timestamps a probe reads
                info = self.info(info.path)
            try:
                got, cpu = timed(lambda: self.decoder("pyav").decode(info, size, frames, out))
                if name == "pyav":
                    self._measured(measured, "pyav", cpu, frames, info)
            except OffTimeline:
                info = self._full_probe(info)
                got = self.decoder("pyav").decode(info, size, frames, out)
            self.decodes["pyav"] += 1
            return got
        except Exception as e:
            if refused is None:
                raise
            # Neither reads it: say both reasons (the worker adds the file's name).
            raise ValueError(f"{first_line(e, 160)}; decord: {first_line(refused, 160)}") from e

    def _measured(self, shape: Shape | None, name: str, cpu: float, frames: np.ndarray, info: VideoInfo) -> None:
        """A read timed for ``shape``'s measurement went as asked (``name`` gave the frames)."""
        if shape is not None and self.measuring is not None and info.keyframes is not None:
            self.measuring.done(shape, name, cpu, frames, info.keyframes)


def _weight(info: VideoInfo) -> int:
    """What a kept probe counts for against ``_PROBED_FRAMES``."""
    return (info.frames if info.pts is not None else 0) + \
        (0 if info.audio_packets is None else len(info.audio_packets))
