"""Where ``VideoClips`` puts its clips, as plain functions: decide the same frames, scale and crop
windows as a worker does without a loader (to decode the same views with another tool, or to
check a loader's output).

- ``clip_frames(num_frames, pts, clip_len=, frame_step=, fps=, sampling=, clips=, total_clips=,
  short_video=, rng=)``: frame indices ``[len(clips), clip_len]``;
- ``scaled_size(height, width, short_side)``: the size ``scale=short_side`` decodes to;
- ``crop_windows(height, width, crop, crop_at, nclips, rng)``: top-left corners
  ``[nclips, views, 2]`` of the crop windows (``crop_at="three"``: three along the long side).
"""

from ._sampling import clip_frames, crop_windows, scaled_size

__all__ = ["clip_frames", "crop_windows", "scaled_size"]
