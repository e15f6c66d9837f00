"""Qwen-VL's video input as pure functions: which frames, what size, which patches.

The same numbers qwen-vl-utils' ``fetch_video`` (decord and torchcodec readers) and transformers'
Qwen-VL video processors give, from a video's frame count, average rate and size, before
anything is decoded; their defaults and names:

- ``frame_indices(num_frames, video_fps, fps=, nframes=, min_frames=, max_frames=, video_start=,
  video_end=)``: the frames to read (``smart_nframes``, ``calculate_video_frame_range``,
  ``torch.linspace(...).round()`` in float32 as torch computes it);
- ``sample_fps(...)``, ``second_per_grid_ts(...)``: the rate the sampled frames show, the seconds
  one temporal patch spans (Qwen2.5-VL's ``second_per_grid_ts``);
- ``frame_size(height, width, nframes, ...)``: the size every frame is resized to (``smart_resize``
  under the per-frame share of the video's pixel budget);
- ``patches(frames)``, ``grid_thw(...)``, ``normalize(rows)``: ``pixel_values_videos`` and
  ``video_grid_thw`` as ``Qwen2VLVideoProcessor`` (and Qwen3-VL's) make them from resized frames;
- ``plan(num_frames, video_fps, height, width, ...)``: all of the above for one video, a ``VideoPlan``;
- ``clips(paths, ...)``: a source for ``shmloader.Loader`` of one sample per video as the model
  takes it, decoded at the planned size (``Recipe``, over ``shmloader.video.planned``);
  ``Loader(..., batch_tokens=N)`` packs as many videos as fit ``N`` tokens; ``from_manifest(scan.csv)``:
  the same, planned from a ``shmloader scan`` manifest's columns, no video opened.

``model`` names the family: ``"qwen2-vl"`` and ``"qwen2.5-vl"`` (patch 14, CLIP's mean and std),
``"qwen3-vl"`` (patch 16, mean and std 0.5). The per-video budget follows the environment variable
``MODEL_SEQ_LEN`` (default 128000) as qwen-vl-utils does, read at each call.

What lives here, the family's folder, a module a line:

- ``inputs``: the pure functions above and ``VideoPlan`` (over the general parts of ``shmloader.vlm``)
- ``source``: ``Recipe`` (a ``shmloader.planned.Recipe``) and ``clips()``, the source over
  ``shmloader.planned.PlannedVideos``, which brings storage, decoding, skipping, resume and Ray
- ``soundtrack``: a video's sound track whole, as Qwen-Omni's speech encoder takes it

What it may import: the standard library, numpy, PyAV and soxr (the sound), ``shmloader._checks``,
``shmloader._errors``, ``shmloader._lazy``, the general parts (``shmloader.vlm``) and the house of
planned families (``shmloader.video.planned``, ``.storage``, ``.arguments``), never another family.
"""
from .inputs import (MODELS, VideoPlan, frame_indices, frame_size, grid_thw, normalize, patches, plan, sample_fps,
                   second_per_grid_ts)
from .source import Recipe, clips, from_manifest

__all__ = ["MODELS", "Recipe", "VideoPlan", "clips", "frame_indices", "from_manifest", "frame_size", "grid_thw", "normalize", "patches",
           "plan", "sample_fps", "second_per_grid_ts"]
