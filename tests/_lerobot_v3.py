"""A small LeRobot v3 dataset written without LeRobot (pyarrow and the frame-code videos of
``shmloader.samples``), laid out as LeRobot 0.6's writer lays it out: episodes one after another
in each camera's MP4, each from its ``from_timestamp``.

Camera ``observation.images.front`` (video id 1) keeps episodes 0-1 in ``file-000.mp4`` and the
rest in ``file-001.mp4``; ``observation.images.wrist`` (video id 2) keeps all in one file. Frame
``k`` of a file shows the code (video id, ``k``), so ``read_codes`` tells which frame a decoded
image is; timestep ``f`` of an episode whose stretch begins at frame ``b`` of its file is frame
``b + f``. ``observation.state`` of row ``r`` is ``[r, r + 0.25, r + 0.5, r + 0.75]``, ``action``
``[-r, -r - 0.5, -r - 1]``: a window's rows are read back from its values.
"""

from __future__ import annotations

import json
import os

import numpy as np

from shmloader.samples import write_video

FPS = 25
LENGTHS = (9, 6, 11, 4)
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
CAMERAS = {FRONT: 1, WRIST: 2}
SIZE = (96, 128)
# Episodes in each file of a camera: (chunk, file) -> episodes.
FILES = {FRONT: {(0, 0): (0, 1), (0, 1): (2, 3)}, WRIST: {(0, 0): (0, 1, 2, 3)}}
TASKS = ("pick the cube", "open the drawer")


def first_frames(camera: str) -> dict[int, int]:
    """Episode -> the frame of its file where its stretch begins."""
    out = {}
    for episodes in FILES[camera].values():
        at = 0
        for e in episodes:
            out[e] = at
            at += LENGTHS[e]
    return out


def write(root: str, *, shift: dict[int, float] | None = None, gop: int = 5) -> str:
    """The dataset at ``root``; ``shift``: seconds added to an episode's front ``from_timestamp``
    (a stretch placed off the file's frames)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shift = shift or {}
    h, w = SIZE
    features = {c: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                    "info": {"video.height": h, "video.width": w, "video.codec": "h264", "video.fps": FPS}}
                for c in CAMERAS}
    features.update({"observation.state": {"dtype": "float32", "shape": [4], "names": None},
                     "action": {"dtype": "float32", "shape": [3], "names": None},
                     **{k: {"dtype": d, "shape": [1], "names": None} for k, d in
                        (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"),
                         ("index", "int64"), ("task_index", "int64"))}})
    info = {"codebase_version": "v3.0", "fps": FPS, "features": features, "total_episodes": len(LENGTHS),
            "total_frames": sum(LENGTHS), "chunks_size": 1000,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"}
    os.makedirs(os.path.join(root, "meta", "episodes", "chunk-000"), exist_ok=True)
    with open(os.path.join(root, "meta", "info.json"), "w") as f:
        json.dump(info, f)
    for camera, vid in CAMERAS.items():
        for (chunk, file), episodes in FILES[camera].items():
            folder = os.path.join(root, "videos", camera, f"chunk-{chunk:03d}")
            os.makedirs(folder, exist_ok=True)
            write_video(os.path.join(folder, f"file-{file:03d}.mp4"), vid, frames=sum(LENGTHS[e] for e in episodes),
                        size=SIZE, fps=FPS, gop=gop)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    episodes = {"episode_index": list(range(len(LENGTHS))), "length": list(LENGTHS),
                "tasks": [[TASKS[e % 2]] for e in range(len(LENGTHS))],
                "data/chunk_index": [0] * len(LENGTHS), "data/file_index": [0, 0, 1, 1],
                "dataset_from_index": starts[:-1].tolist(), "dataset_to_index": starts[1:].tolist()}
    for camera in CAMERAS:
        where = {e: key for key, eps in FILES[camera].items() for e in eps}
        first = first_frames(camera)
        begin = [first[e] / FPS + (shift.get(e, 0.0) if camera == FRONT else 0.0) for e in range(len(LENGTHS))]
        episodes.update({f"videos/{camera}/chunk_index": [where[e][0] for e in range(len(LENGTHS))],
                         f"videos/{camera}/file_index": [where[e][1] for e in range(len(LENGTHS))],
                         f"videos/{camera}/from_timestamp": begin,
                         f"videos/{camera}/to_timestamp": [b + LENGTHS[e] / FPS for e, b in enumerate(begin)]})
    pq.write_table(pa.table(episodes), os.path.join(root, "meta", "episodes", "chunk-000", "file-000.parquet"))
    pq.write_table(pa.table({"task_index": [0, 1], "task": list(TASKS)}), os.path.join(root, "meta", "tasks.parquet"))
    os.makedirs(os.path.join(root, "data", "chunk-000"), exist_ok=True)
    for file, eps in ((0, (0, 1)), (1, (2, 3))):
        rows = np.arange(starts[eps[0]], starts[eps[-1] + 1])
        episode = np.repeat(eps, [LENGTHS[e] for e in eps])
        frame = rows - starts[episode]
        state = rows[:, None] + np.array([0, 0.25, 0.5, 0.75])
        action = -rows[:, None] - np.array([0, 0.5, 1.0])
        table = pa.table({
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel(), pa.float32()), 4),
            "action": pa.FixedSizeListArray.from_arrays(pa.array(action.ravel(), pa.float32()), 3),
            "timestamp": pa.array(frame / FPS, pa.float32()), "frame_index": frame.astype(np.int64),
            "episode_index": episode.astype(np.int64), "index": rows.astype(np.int64),
            "task_index": (episode % 2).astype(np.int64)})
        pq.write_table(table, os.path.join(root, "data", "chunk-000", f"file-{file:03d}.parquet"))
    return root
