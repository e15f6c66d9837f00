"""The random-access evidence: whether decord, opening a file afresh and seeking as the loader
does, gives the frames PyAV's decode by timestamps gives (NOTE [ Which decoder reads a file ] in
``video.probe``). What ``shmloader scan`` runs (``check="keyframes"`` or ``"frames"``); a
worker's quick probe gathers none. And the speed evidence (``shmloader scan --measure-cut``):
which of the two, where both are exact, reads a cut of the file with less CPU
(NOTE [ Measuring the decoder ] in ``video.measuring``).
"""

from __future__ import annotations

import numpy as np

from ..video.decoders import DecoderLimit
from ..video.decord import Decord
from ..video.measuring import TIMED, WARM, Cut, measurable, timed
from ..video.media import Media
from ..video.probe import VideoInfo, probe
from ..video.pyav import PyAV
from ..video.storage import Storage, first_line

__all__ = ["probe_with_evidence", "check_seeks", "seek_positions", "measure_decoders"]

# The random-access evidence (``check="keyframes"`` and ``"frames"``): keyframes it seeks around,
# and how far decord's frame may be from PyAV's (grey levels; both convert with swscale at the
# native size, measured within 1 on average): a wrong frame differs by far more in some region.
_SEEK_KEYFRAMES = 3
_SEEK_ONE_KEYFRAME = 12
_SEEK_MEAN = 3.0
_SEEK_P99 = 32.0


def probe_with_evidence(path: str | Media, *, check: str = "keyframes", storage: Storage | None = None) -> VideoInfo:
    """``probe(path, check=check)``, and with ``check="keyframes"`` or ``"frames"`` a file decord
    would read (PyAV's for speed alone included: its manifest row says decord) sent to PyAV for
    good where the evidence shows decord seeking wrong."""
    info = probe(path, check=check, storage=storage)
    if check != "headers" and (info.decoder == "decord" or info.pyav_faster):
        return check_seeks(info)
    return info


def seek_positions(info: VideoInfo) -> np.ndarray:
    """The frames the random-access evidence compares, seeded by the frame count (a scan
    repeats): the keyframe and the frame after it at a few keyframes past the first (where a
    seek that lands a GOP early or late shows, at the cost of decoding a frame or two); in a
    file with one keyframe, where nothing is seeked, a frame past the decoder's reorder delay."""
    n = info.frames
    keys = info.keyframes[info.keyframes > 0] if info.keyframes is not None else np.zeros(0, np.int64)
    if not len(keys):
        return np.array([min(n - 1, _SEEK_ONE_KEYFRAME)], np.int64)
    chosen = np.random.default_rng(n).choice(keys, min(_SEEK_KEYFRAMES, len(keys)), replace=False)
    return np.unique(np.minimum(np.concatenate([chosen, chosen + 1]), n - 1))


def check_seeks(info: VideoInfo) -> VideoInfo:
    """``info`` sent to PyAV when decord, opening the file afresh and seeking as the loader
    does, gives other frames than PyAV's decode by timestamps at ``seek_positions``."""
    frames = seek_positions(info)
    try:
        want = PyAV(1).decode(info, None, frames)
    except Exception:
        return info  # damage (reported by the probe) or worse: no reference to compare with
    decord = Decord(1)
    for i, ref in zip(frames, want):
        try:
            got = decord.decode(info, None, np.array([i]))[0]
        except DecoderLimit:
            return info  # decord cannot copy this width out here: the loader uses PyAV anyway
        except decord.Error as e:
            return info.with_decoder("pyav", f"decord refuses it: {first_line(e, 160)}")
        diff = np.abs(got.astype(np.int16) - ref) if got.shape == ref.shape else None
        if diff is None or diff.mean() > _SEEK_MEAN or np.percentile(diff, 99) > _SEEK_P99:
            return info.with_decoder("pyav", f"decord seeks wrong at frame {int(i)} (read by PyAV)")
    return info


def measure_decoders(info: VideoInfo, cut: Cut) -> dict[str, float] | None:
    """CPU ms a read of ``cut`` takes each decoder on ``info``'s file, the same seeded random
    clips for both (``WARM`` untimed, then ``TIMED`` timed, each decoder's in turn, fresh
    decoders as a worker's); None where not both read the file exactly, or one fails it."""
    if not measurable(info):
        return None
    span = (cut.length - 1) * cut.step + 1
    rng = np.random.default_rng(info.frames)
    reads = [np.unique(np.concatenate([np.arange(s, s + span, cut.step) for s in
                                       rng.integers(0, max(1, info.frames - span + 1), cut.together)]))
             for _ in range(WARM + TIMED)]
    reads = [np.minimum(r, info.frames - 1) for r in reads]
    decoders: dict[str, Decord | PyAV] = {"decord": Decord(1), "pyav": PyAV(1)}
    took: dict[str, float] = {"decord": 0.0, "pyav": 0.0}
    try:
        for i, frames in enumerate(reads):
            for name, d in decoders.items():
                _, cpu = timed(lambda: d.decode(info, cut.decode_size, np.unique(frames)))
                took[name] += cpu if i >= WARM else 0.0
    except Exception:
        return None  # decord refuses it, cannot copy the width out: the rule's choice stands
    return {name: round(1000 * t / TIMED, 2) for name, t in took.items()}
