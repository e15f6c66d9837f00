"""Where ``VideoClips`` puts its clips, as plain functions: decide the same frames, scale and crop
windows as a worker does without a loader (to decode the same views with another tool, or to
check a loader's output).

- ``clip_frames(num_frames, pts, clip_len=, frame_step=, fps=, sampling=, clips=, total_clips=,
  short_video=, rng=, span=None)``: frame indices ``[len(clips), clip_len]`` (``sampling=
  "segments"`` / ``"segments_uniform"``: one frame in each of ``clip_len`` segments of time);
- ``rate_frames(num_frames, pts, fps=, max_frames=, sampling=, short_video=, rng=, span=None)``:
  the frame indices of ``fps=F, max_frames=M`` (1-D, at most ``M``);
- ``span_frames(num_frames, pts, span, short_video)``: the frames a time span holds;
- ``scaled_size(height, width, short_side)``: the size ``scale=short_side`` decodes to;
- ``crop_windows(height, width, crop, crop_at, nclips, rng)``: top-left corners
  ``[nclips, views, 2]`` of the crop windows (``crop_at="three"``: three along the long side).

``pts`` is ``[num_frames, 2]`` (start, end) seconds of every frame, as a sequential decode
shows them; the rules that speak of time are NOTE [ Time spans, segments and frame rates ] in
``shmloader.clips.sampling``.
"""

from .clips.sampling import clip_frames, crop_windows, rate_frames, scaled_size, span_frames

__all__ = ["clip_frames", "crop_windows", "rate_frames", "scaled_size", "span_frames"]
