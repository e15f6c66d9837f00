"""``VideoClips``' options, each stated once: what a sample holds (``Sampling``), at what size
(``Pixels``), its sound (``Audio``) and how the workers read the files (``Reading``, the house's
group that every family takes: ``video.reading``).

Each group is a frozen dataclass whose fields are documented here alone; the constructor, the
``options()`` dict, ``with_options``, the description's digest and the API reference all read
them from here. A field's flat keyword (``VideoClips(paths, clip_len=8)``) is its name, or the
``keyword`` of its metadata where the group's name would repeat in it (``Audio.rate`` is
``audio_rate``, ``Sampling.mode`` is ``sampling``). A group checks its own fields when it is made;
``merged`` applies a call's groups and keywords and checks what the groups say together.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, TypedDict

import numpy as np

from .._checks import check_choice, check_int
from ..video.reading import Reading
from .sampling import SEGMENTS


__all__ = ["Sampling", "Pixels", "Audio", "Reading", "OptionKeywords", "GROUPS", "KEYWORDS", "merged", "flat"]

SAMPLINGS = ("random", "uniform", "center", *SEGMENTS)
SHORT_POLICIES = ("error", "repeat_last", "wrap")
CROP_AT = ("center", "random", "three")
AUDIO_CHANNELS = (1, 2)
_CLIP_LEN = 16  # frames per clip when neither clip_len nor max_frames is given


def _keyword(name: str) -> dict[str, str]:
    """A field's metadata naming its flat keyword, where that is not the field's name."""
    return {"keyword": name}


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """Which frames make a sample: ``clip_len`` frames every ``frame_step`` frames, or with
    ``fps=F`` every ``1/F`` seconds of video time, placed as ``mode`` says; how many clips a
    sample and a video have. Times are the file's own (NOTE [ Time spans, segments and frame
    rates ] in ``clips.sampling``)."""

    mode: str = field(default="random", metadata=_keyword("sampling"))
    """``"random"`` (independent seeded starts, new each epoch), ``"uniform"`` (spread evenly over
    the video), ``"center"``, ``"segments"`` (TSN: one seeded frame in each of ``clip_len`` equal
    stretches of time) or ``"segments_uniform"`` (each stretch's centre). Keyword ``sampling``."""
    clip_len: int | None = None
    """Frames per clip: 16 when not given; none with ``max_frames``."""
    frame_step: int = 1
    """Take every ``frame_step``-th frame."""
    fps: float | None = None
    """Pick frames every ``1/fps`` seconds of presentation time instead of by index."""
    max_frames: int | None = None
    """With ``fps``: up to this many frames of the whole video (or span), evenly thinned, padded,
    with a ``mask`` field."""
    clips_per_video: int = 1
    """Samples per video in an epoch."""
    clips_per_sample: int = 1
    """Clips of one video in each sample (a ``[K, ...]`` leading axis)."""
    short_video: str = "error"
    """``"error"``, ``"repeat_last"`` (the last frame the clip reaches, repeated) or ``"wrap"``
    (the clip's frames from its beginning again) for a video shorter than one clip."""

    def __post_init__(self) -> None:
        if self.max_frames is not None:
            check_int("max_frames", self.max_frames, 1)
            if self.clip_len is not None:
                raise ValueError("max_frames and clip_len exclude each other: with max_frames a sample holds "
                                 "the frames at fps= frames per second, up to max_frames")
            if self.fps is None:
                raise ValueError("max_frames needs fps=: the frames are taken fps per second, up to max_frames")
            if self.mode in SEGMENTS:
                raise ValueError(f"sampling={self.mode!r} needs clip_len (the number of segments), not max_frames")
            if self.clips_per_sample != 1:
                raise ValueError("max_frames takes clips_per_sample=1: a sample already spans the whole video")
        clip_len = _CLIP_LEN if self.clip_len is None and self.max_frames is None else self.clip_len
        for name, v in (("clip_len", clip_len), ("frame_step", self.frame_step),
                        ("clips_per_video", self.clips_per_video), ("clips_per_sample", self.clips_per_sample)):
            if v is not None:  # clip_len: None with max_frames
                check_int(name, v, 1)
        check_choice("sampling", self.mode, SAMPLINGS)
        if self.mode in SEGMENTS and (self.fps is not None or self.frame_step != 1):
            raise ValueError(f"sampling={self.mode!r} takes one frame per segment of time: "
                             "it excludes fps and frame_step")
        check_choice("short_video", self.short_video, SHORT_POLICIES)
        fps = self.fps
        if fps is not None:
            if not isinstance(fps, (int, float, np.integer, np.floating)) or isinstance(fps, bool) \
                    or not np.isfinite(fps) or fps <= 0:
                raise ValueError(f"fps must be a positive number of frames per second, got {fps!r}")
            if self.frame_step != 1:
                raise ValueError("fps and frame_step exclude each other: with fps= frames are picked by time")
            fps = float(fps)
        _set(self, clip_len=None if clip_len is None else int(clip_len), fps=fps, frame_step=int(self.frame_step),
             max_frames=None if self.max_frames is None else int(self.max_frames),
             clips_per_video=int(self.clips_per_video), clips_per_sample=int(self.clips_per_sample))

    @property
    def length(self) -> int:
        """Frames per clip in a batch (``T``): ``clip_len``, or ``max_frames``."""
        n = self.max_frames if self.clip_len is None else self.clip_len
        assert n is not None, "max_frames stands for clip_len"
        return n

    @property
    def whole_video(self) -> bool:
        """Does a sample spread over the whole video (or its span): segments, ``max_frames``?"""
        return self.mode in SEGMENTS or self.max_frames is not None

    def for_eval(self) -> Sampling:
        """Deterministic: ``"uniform"`` for ``"random"``, ``"segments_uniform"`` for ``"segments"``."""
        mode = {"random": "uniform", "segments": "segments_uniform"}.get(self.mode, self.mode)
        return self if mode == self.mode else replace(self, mode=mode)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pixels:
    """Which pixels a clip holds: every frame stretched to ``size``, or its short side scaled to
    ``scale`` keeping the aspect ratio (both in the decoder), then a ``crop`` window cut at
    ``crop_at``. Neither ``size`` nor ``scale``: the native size, which every video must share
    unless ``crop`` is set."""

    size: tuple[int, int] | None = None
    """``(height, width)`` every frame is stretched to while decoding; None: native."""
    scale: int | tuple[int, int] | None = None
    """The short side scaled to ``S``, or drawn in ``(S_min, S_max)`` per sample (per video and
    epoch with ``group_clips``); needs ``crop``. Kept as ``(S_min, S_max)``."""
    crop: tuple[int, int] | None = None
    """``(height, width)`` window cut at ``crop_at``."""
    crop_at: str = "center"
    """``"center"``, ``"random"`` (seeded, one per clip) or ``"three"`` (three views per clip:
    left/top, center, right/bottom along the long side)."""

    def __post_init__(self) -> None:
        check_choice("crop_at", self.crop_at, CROP_AT)
        size = None if self.size is None else _pair("size", self.size)
        crop = None if self.crop is None else _pair("crop", self.crop)
        if crop is None and self.crop_at != "center":
            raise ValueError(f"crop_at={self.crop_at!r} needs crop=(height, width)")
        scale = None if self.scale is None else _scale_range(self.scale)
        if scale is not None:
            if crop is None:
                raise ValueError("scale needs crop=(height, width): scaled videos of different aspect "
                                 "ratios only share a shape once cropped")
            if size is not None:
                raise ValueError("scale and size exclude each other: size stretches, scale keeps the aspect ratio")
            if crop[0] > scale[0] or crop[1] > scale[0]:
                raise ValueError(f"crop={crop} does not fit in an S_min x S_min = {scale[0]}x{scale[0]} "
                                 "square: it must fit a scaled video of any aspect ratio")
        if crop is not None and size is not None and (crop[0] > size[0] or crop[1] > size[1]):
            raise ValueError(f"crop={crop} does not fit in size={size}")
        _set(self, size=size, crop=crop, scale=scale)

    @property
    def native(self) -> bool:
        """Decoded at each file's own size (neither ``size`` nor ``scale``)."""
        return self.size is None and self.scale is None

    @property
    def short_side(self) -> tuple[int, int] | None:
        """``scale`` as ``(S_min, S_max)``, or None."""
        s = self.scale
        return s if s is None or isinstance(s, tuple) else (s, s)

    def for_eval(self) -> Pixels:
        """Deterministic: the short side ``S_min`` of a ``scale`` range, central windows for random
        ones (``"three"`` stays)."""
        s = self.short_side
        out = self if s is None or s[0] == s[1] else replace(self, scale=s[0])
        return replace(out, crop_at="center") if self.crop_at == "random" else out


@dataclass(frozen=True, slots=True, kw_only=True)
class Audio:
    """Each clip's sound (``audio``, ``audio_len``: NOTE [ Where a clip's audio lies ] in
    ``video.audio``): the audio of its span at ``rate`` Hz. ``VideoClips.audio`` is None without."""

    rate: int = field(metadata=_keyword("audio_rate"))
    """Hz of each clip's audio. Keyword ``audio_rate`` (None: no audio)."""
    channels: int = field(default=1, metadata=_keyword("audio_channels"))
    """1 (mono: stereo's mean) or 2 (stereo: mono copied to both). Keyword ``audio_channels``."""
    seconds: float | None = field(default=None, metadata=_keyword("audio_seconds"))
    """The longest span a clip may have (``S``); None: from the clips. Required with segments and
    ``max_frames``, whose samples span the whole video (or its span): the room every sample's
    audio has, a longer span cut there (``audio_len == S``). Keyword ``audio_seconds``."""

    def __post_init__(self) -> None:
        check_int("audio_rate", self.rate, 1)
        if isinstance(self.channels, bool) or self.channels not in AUDIO_CHANNELS:
            raise ValueError(f"audio_channels must be 1 (mono) or 2 (stereo), got {self.channels!r}: every "
                             "file's sound is mixed to it (stereo to its mean, mono copied to both channels, "
                             "other layouts by FFmpeg's matrix)")
        s = self.seconds
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not np.isfinite(s) or s <= 0):
            raise ValueError(f"audio_seconds must be a positive number of seconds, got {s!r}")
        _set(self, rate=int(self.rate), channels=int(self.channels), seconds=None if s is None else float(s))


class OptionKeywords(TypedDict, total=False):
    """Every field of the groups by its flat keyword, as ``VideoClips`` takes them (``sampling``,
    which also takes a whole ``Sampling``, is the constructor's own argument)."""

    clip_len: int | None
    frame_step: int
    fps: float | None
    max_frames: int | None
    clips_per_video: int
    clips_per_sample: int
    short_video: str
    size: tuple[int, int] | None
    scale: int | tuple[int, int] | None
    crop: tuple[int, int] | None
    crop_at: str
    audio_rate: int | None
    audio_channels: int
    audio_seconds: float | None
    decoder: str
    decode_threads: int
    group_clips: bool
    storage_options: Mapping[str, Any] | None
    fetch: Mapping[str, Any] | None
    allow_urls: bool


# The groups by the attribute (and keyword) of ``VideoClips`` that holds each.
GROUPS: dict[str, type] = {"sampling": Sampling, "pixels": Pixels, "audio": Audio, "reading": Reading}
# A group that may be absent (``VideoClips.audio`` is None), and the field whose None removes it.
_ABSENT_WITHOUT = {"audio": "rate"}
# Every flat keyword: (the group, its field).
KEYWORDS: dict[str, tuple[str, str]] = {f.metadata.get("keyword", f.name): (g, f.name)
                                        for g, cls in GROUPS.items() for f in fields(cls)}


def merged(groups: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``groups`` (``{"sampling": Sampling(...), ..., "audio": None}``; ``{}`` for none yet) with
    ``changes`` applied: a group given whole (``pixels=Pixels(...)``, ``audio=None``), or a field
    by its flat keyword (``clip_len=8``, ``sampling="uniform"``, ``audio_rate=None``: no audio),
    replacing that field of the group (of a group not there, making it from the fields given);
    checked together. A keyword of a group given whole in the same call is a ValueError, an
    unknown one a TypeError."""
    out, whole = dict(groups), set()
    by_group: dict[str, dict[str, Any]] = {}
    for k, v in changes.items():
        if k in GROUPS and (isinstance(v, GROUPS[k]) or (v is None and k in _ABSENT_WITHOUT)):
            out[k] = v
            whole.add(k)
        elif k in KEYWORDS:
            g, name = KEYWORDS[k]
            by_group.setdefault(g, {})[name] = v
        elif k in GROUPS:
            raise TypeError(f"{k} must be a {GROUPS[k].__name__}, got {v!r}")
        else:
            near = difflib.get_close_matches(k, [*KEYWORDS, *GROUPS], 1)
            raise TypeError(f"VideoClips got an unexpected keyword argument {k!r}"
                            + (f"; did you mean {near[0]!r}?" if near else ""))
    for g, values in by_group.items():
        if g in whole:
            raise ValueError(f"{', '.join(_keywords(g, values))} and {g}= given together: the group "
                             f"{GROUPS[g].__name__} holds them")
        out[g] = _changed(g, out.get(g), values)
    for g, cls in GROUPS.items():
        if out.get(g) is None:  # not given: its defaults, or not there
            out[g] = None if g in _ABSENT_WITHOUT else cls()
    _check_together(out["sampling"], out["audio"])
    return out


def flat(groups: Mapping[str, Any]) -> dict[str, Any]:
    """Every flat keyword and its value in ``groups`` (an absent group's defaults, its key None)."""
    out: dict[str, Any] = {}
    for g, cls in GROUPS.items():
        for f in fields(cls):
            if groups[g] is not None:
                value = getattr(groups[g], f.name)
            else:
                value = None if f.name == _ABSENT_WITHOUT.get(g) else f.default
            out[f.metadata.get("keyword", f.name)] = value
    return out


def _changed(g: str, current: Any, values: dict[str, Any]) -> Any:
    """Group ``g`` with ``values`` (by field name) replaced; an optional group made, or removed."""
    cls, key = GROUPS[g], _ABSENT_WITHOUT.get(g)
    if key is not None and (values[key] is None if key in values else current is None):
        extra = [f for f in fields(cls) if f.name in values and f.name != key and values[f.name] != f.default]
        if extra:  # a field of a group that is not there
            raise ValueError(f"{_keywords(g, [extra[0].name])[0]} needs {_keywords(g, [key])[0]}=: "
                             f"without it there is no {g}")
        return None
    return cls(**values) if current is None else replace(current, **values)


def _keywords(g: str, names: Iterable[str]) -> list[str]:
    """The flat keywords of group ``g``'s fields ``names``, in the group's order."""
    names = set(names)
    return [f.metadata.get("keyword", f.name) for f in fields(GROUPS[g]) if f.name in names]


def _check_together(sampling: Sampling, audio: Audio | None) -> None:
    if audio is not None and audio.seconds is None and sampling.whole_video:
        recipe = "max_frames" if sampling.max_frames is not None else f"sampling={sampling.mode!r}"
        raise ValueError(f"audio_rate with {recipe} needs audio_seconds=: a sample spans the whole video "
                         "(or its span), whose length varies, and audio_seconds sets S, the fixed room "
                         "every sample's audio has (e.g. 30 for a Whisper encoder); a longer span is "
                         "cut there")


def _set(obj: Any, **values: Any) -> None:
    """Normalised values into a frozen group, while it is made."""
    for k, v in values.items():
        object.__setattr__(obj, k, v)


def _pair(name: str, value: Any) -> tuple[int, int]:
    try:
        a, b = value
        ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in (a, b))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be (height, width) with positive integers, got {value!r}")
    return int(a), int(b)


def _scale_range(scale: Any) -> tuple[int, int]:
    if isinstance(scale, (int, np.integer)) and not isinstance(scale, bool):
        lo = hi = int(scale)
    else:
        try:
            lo, hi = scale
            if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (lo, hi)):
                raise TypeError
        except (TypeError, ValueError):
            raise ValueError(f"scale must be a short-side length or (S_min, S_max), got {scale!r}") from None
        lo, hi = int(lo), int(hi)
    if lo < 1:
        raise ValueError(f"scale must be positive, got {scale!r}")
    if lo > hi:
        raise ValueError(f"scale=(S_min, S_max) needs S_min <= S_max, got {scale!r}")
    return lo, hi
