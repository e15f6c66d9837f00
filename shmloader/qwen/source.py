"""Qwen-VL's recipe over the house of planned videos: each video's plan, its fields filled from
the frames decoded at the planned size (and Qwen-Omni's sound), and ``clips()``, the source."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np

from .inputs import FPS, FPS_MAX_FRAMES, FPS_MIN_FRAMES, FRAME_FACTOR, _model, patches, plan

if TYPE_CHECKING:
    from ..video.planned import PlannedVideos

__all__ = ["Recipe", "clips", "from_manifest"]


@dataclass(frozen=True)
class Recipe:
    """Qwen-VL's inputs from a video (``video.planned.Recipe``): ``plan``'s frames and size for
    the keywords given, the frames as patch rows (``pixel_values_videos``, uint8: ``normalize``
    gives the model's floats), ``video_grid_thw`` and ``second_per_grid_ts``; a video's cost is its
    tokens."""

    model: str = "qwen2.5-vl"
    options: tuple[tuple[str, Any], ...] = ()
    audio_rate: int | None = None
    # Frames a temporal patch takes: its rows are filled as soon as they are decoded.
    part: ClassVar[int] = FRAME_FACTOR

    def spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        patch = _model(self.model)[0]
        spec: dict[str, tuple[tuple[int, ...], np.dtype]] = {
                "pixel_values_videos": ((-1, 3 * FRAME_FACTOR * patch * patch), np.dtype(np.uint8)),
                "video_grid_thw": ((3,), np.dtype(np.int64)), "second_per_grid_ts": ((), np.dtype(np.float32))}
        if self.audio_rate is not None:  # room for the longest track the container allows; audio_len says
            spec.update(audio=((-1,), np.dtype(np.float32)), audio_len=((), np.dtype(np.int64)))
        return spec

    def plan(self, video: Any) -> Any:
        from ..video.planned import Planned

        start, end = video.span if video.span is not None else (None, None)
        p = plan(video.frames, video.fps, video.height, video.width, model=self.model, pts=video.times,
                 video_start=start, video_end=end, **dict(self.options))
        t, gh, gw = p.grid_thw
        n = len(p.indices)
        rows = {"pixel_values_videos": t * gh * gw, "frames": n, "times": n}
        if self.audio_rate is not None:
            from .soundtrack import bound

            rows["audio"] = bound(video.duration, self.audio_rate)
        return Planned(indices=p.indices, size=(p.height, p.width), rows=rows, cost=p.tokens, extra=p)

    def fill_part(self, frames: np.ndarray, k: int, planned: Any, out: dict[str, np.ndarray]) -> None:
        """The rows of temporal patch ``k`` from its frames."""
        _, gh, gw = planned.extra.grid_thw
        patches(frames, model=self.model, out=out["pixel_values_videos"][k * gh * gw : (k + 1) * gh * gw])

    def fill(self, frames: np.ndarray | None, planned: Any, video: Any, out: dict[str, np.ndarray]) -> None:
        p = planned.extra
        if frames is not None:
            patches(frames, model=self.model, out=out["pixel_values_videos"])
        out["video_grid_thw"][:] = p.grid_thw
        out["second_per_grid_ts"][...] = p.second_per_grid_ts
        if self.audio_rate is not None:
            from .soundtrack import read_track

            start, end = video.span if video.span is not None else (None, None)
            sound = read_track(video.path, self.audio_rate, start, end, storage=video.storage)
            room = out["audio"]
            if len(sound) > len(room):
                raise ValueError(f"the sound track gives {len(sound)} samples, more than the {len(room)} the "
                                 f"container's duration ({video.duration:.3f} s) allows")
            room[: len(sound)] = sound
            room[len(sound) :] = 0
            out["audio_len"][...] = len(sound)


def clips(paths: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None, *,
          model: str = "qwen2.5-vl", fps: float | None = FPS, nframes: int | None = None,
          min_frames: int = FPS_MIN_FRAMES, max_frames: int = FPS_MAX_FRAMES, min_pixels: float | None = None,
          max_pixels: float | None = None, total_pixels: float | None = None, resized_height: int | None = None,
          resized_width: int | None = None, spans: Sequence[tuple[float | None, float | None] | None] | None = None,
          decoder: str = "auto", decode_threads: int = 1, audio_rate: int | None = None,
          storage_options: Mapping[str, Any] | None = None, fetch: Mapping[str, Any] | None = None,
          allow_urls: bool = False, on_error: str = "raise", threads: int | None = None,
          probes: str | os.PathLike[str] | None = None, metas: Sequence[Any] | None = None) -> PlannedVideos:
    """A source for ``shmloader.Loader`` of one sample per video, as Qwen-VL takes it: sample ``i``
    holds what ``qwen_vl_utils.fetch_video({"video": paths[i], "fps": fps, ...})`` and the model's
    video processor (``do_resize=False``) make of it — the same frame indices and size, the frames
    decoded at that size rather than at full size and resized — as uint8 patch rows
    ``pixel_values_videos`` (``normalize`` gives the processor's floats), ``video_grid_thw``,
    ``second_per_grid_ts``, and per frame ``frames`` (its index in the video) and ``times`` (its
    start in seconds, by the file's timestamps, for time markers). ``spans``: per video
    ``(video_start, video_end)`` seconds (None: open). Every video is probed here, once, to plan
    its size: ``Loader(..., batch_tokens=N)`` packs as many videos as fit ``N`` tokens.
    ``audio_rate=16000``: each sample also carries the video's sound as qwen-omni-utils extracts it
    for Qwen-Omni's ``use_audio_in_video`` (the whole track, or its ``spans`` from the track's first
    sample, mono, resampled with soxr; needs ``pip install soxr``), as ``audio`` rows (float32, room
    for the longest track the container's duration allows) and ``audio_len`` (the samples that are real).

    Where the videos live and how they are read, as for ``VideoClips`` (:class:`shmloader.Reading`):
    ``paths`` are local files or fsspec URLs (``s3://``, ``gs://``, ``hf://``, ``https://``), read
    by byte range with ``storage_options`` and ``fetch``; ``decoder``, ``decode_threads``.
    ``on_error="skip"``: a video that cannot be read or planned (missing, cut short, too few
    frames) is left out with a warning and listed in ``.skipped`` as (position, path, reason);
    ``index`` stays its position in ``paths``. ``"raise"`` (the default) names every such video in
    one ValueError.

    Every video is probed here before the first batch: in processes where there are many local
    files, with a progress bar on a terminal. ``probes="probes.csv"`` keeps them: the next run
    reads a video's row there while its file is unchanged and probes only the others.
    ``from_manifest`` plans from a ``shmloader scan`` manifest's columns instead, no file opened.
    """
    from ..video.arguments import renamed_threads
    from ..video.planned import PlannedVideos

    options = dict(fps=fps, nframes=nframes, min_frames=min_frames, max_frames=max_frames, min_pixels=min_pixels,
                   max_pixels=max_pixels, total_pixels=total_pixels, resized_height=resized_height,
                   resized_width=resized_width)
    if nframes is not None:
        options["fps"] = None
    _model(model)  # an unknown model is refused here, before any probe
    if audio_rate is not None:
        if not isinstance(audio_rate, int) or isinstance(audio_rate, bool) or audio_rate < 1:
            raise ValueError(f"audio_rate must be a positive number of samples a second, got {audio_rate!r}")
        try:
            import soxr  # noqa: F401  (the resampler qwen-omni-utils' librosa uses)
        except ImportError as e:
            raise ImportError("qwen.clips(audio_rate=...) resamples the sound with soxr: pip install soxr") from e
    return PlannedVideos(paths, labels, Recipe(model, tuple(options.items()), audio_rate), spans=spans,
                         decoder=decoder, decode_threads=renamed_threads(decode_threads, threads),
                         storage_options=storage_options, fetch=fetch, allow_urls=allow_urls, on_error=on_error,
                         probes=probes, metas=metas)


def from_manifest(manifest: str | os.PathLike[str], *, path_column: str = "path", label_column: str | None = None,
                  **options: Any) -> PlannedVideos:
    """``clips`` over the rows of a ``shmloader scan`` manifest (CSV or JSON; or a file of probes
    ``clips(probes=...)`` kept): each video planned from its row's frames, rate, size and
    duration, no file opened here, so a hundred thousand videos plan in seconds. A row the scan
    could not read is a video that cannot be read (``on_error``); a file changed since the scan
    fails the sample that reads it (its plan no longer matches). ``options``: ``clips``' own."""
    from ..video.planned import manifest_videos

    paths, labels, videos = manifest_videos(manifest, path_column, label_column)
    return clips(paths, labels, metas=videos, **options)
