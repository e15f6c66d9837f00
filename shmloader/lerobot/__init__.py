"""LeRobot datasets (format v3) read as LeRobot reads them, decoded in the loader's workers.

``dataset(root, delta_timestamps=..., episodes=...)`` describes the dataset at ``root`` (a local
folder LeRobot's writer made, its Hub snapshot, or either at an fsspec URL: ``s3://``, ``gs://``,
``hf://``, ``https://``...); ``shmloader.Loader`` runs it, or ``shmloader.ray.dataset`` in Ray
tasks on a cluster's nodes (the loader's epochs, whole stretches a task). Sample ``i`` holds
what ``LeRobotDataset(repo_id, root=root, delta_timestamps=..., episodes=...)[i]`` holds, by the
same keys (NOTE [ A LeRobot sample ] in ``shmloader.lerobot.read``):

- each camera (``observation.images.front``): uint8 ``[H, W, 3]``, or ``[T, H, W, 3]`` with
  ``T`` offsets in ``delta_timestamps``. LeRobot gives float32 ``[(T,) 3, H, W]`` in [0, 1]:
  ``x.permute(..., 3, 1, 2) / 255`` on the device, where it costs nothing;
- every numeric feature (``observation.state``, ``action``, ``timestamp``, ``frame_index``,
  ``episode_index``, ``index``, ``task_index``...), ``[T, ...]`` with a window;
- ``<key>_is_pad``: bool ``[T]`` for each key of ``delta_timestamps``, True where the offset
  passes the episode's edge (the edge's value repeats there).

The task's text is ``dataset.tasks[task_index]`` (LeRobot's ``item["task"]``); features that are
not numbers (language columns) are left out, named in ``dataset.left_out``.

The samples of an epoch are shuffled as the loader shuffles grouped sources: runs of ``stretch``
consecutive timesteps of an episode are groups; the groups are shuffled, and the samples of a
window of groups (``Loader(group_window=)``, about four batches by default) among themselves. A
worker decodes each camera's frames of a group in one pass over its stretch of the file, never
one seek per sample; memory stays the ring's.

What lives here, the family's folder, a module a line:

- ``source``: ``dataset()`` and ``LeRobotSource``, the description (tables, windows, stretches)
- ``meta``: a dataset's metadata and parquet tables read once, local or remote
- ``read``: what a worker (or a Ray task) reads of a sample: frames by their times, features, pads

What it may import: the standard library, numpy, pyarrow (the tables), ``shmloader._checks``,
``shmloader._errors``, ``shmloader._lazy``, the engine's contract for sources and its shared tables,
and the house's reading path (``shmloader.video``: storage, frames by time, decoding), never another
family.
"""
from .source import Dataset, LeRobotSource, dataset

__all__ = ["LeRobotSource", "dataset"]
