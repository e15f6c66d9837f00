"""Whole videos each planned on its own, for a model family's own inputs (video-LLMs): a recipe
decides each video's frames, size and fields; ``PlannedVideos`` decodes them at that size in the
loader's workers. ``shmloader.qwen.clips`` is one such recipe; another family's is a few lines:

- ``Video``: what a recipe plans from (frames, fps, height, width as shown; in a worker each
  frame's start in seconds; the span asked for);
- ``Planned``: a plan (frame indices, decode size, rows of each field of rows, cost);
- ``Recipe``: ``spec()``, ``plan(video)``, ``fill(frames, planned, video, out)``; optionally
  ``part`` and ``fill_part(frames, k, planned, out)``, to be handed the frames a part at a time;
- ``PlannedVideos(paths, labels, recipe, spans=, decoder=, decode_threads=, storage_options=,
  fetch=, on_error=)``: the source, with
  ``frames``, ``times``, ``label`` and ``index`` beside the recipe's fields.

A field whose shape starts with -1 holds rows, as many per sample as its plan says, packed end to
end in a batch beside ``<field>_offsets``; ``Loader(..., batch_tokens=N)`` cuts batches by cost.
"""

from .video.planned import Planned, PlannedVideos, Recipe, Video

__all__ = ["Planned", "PlannedVideos", "Recipe", "Video"]
