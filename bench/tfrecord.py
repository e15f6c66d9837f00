"""The pre-decoded route: convert the bench videos once into TFRecord files (issue #12).

Each sample of epoch 0 (``workloads.sample_keys``: the video's clip at its epoch-0 random
start) becomes one ``tf.train.Example``, either

- ``jpeg``: the clip's frames (every ``frame_step``-th) at the workload's size, each a JPEG
  (quality 90), in a ``bytes_list`` of T entries, or
- ``raw``: the clip as one ``[T, H, W, 3]`` uint8 buffer,

plus its label, spread over ``SHARDS`` files so that ``num_parallel_reads`` has files to read
in parallel. The clips are cut at conversion time: every epoch reads the same clips (only their
order changes), unlike the other loaders, which pick a new random start every epoch.

Files are cached under ``.cache/bench-tfrecord`` by content (videos, format, clip shape); the
manifest keeps the one-off conversion time (one process: decode with decord, encode, write) and
the bytes on disk against the source videos.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import numpy as np

from workloads import CLIPS_PER_VIDEO, SEED, ClipSet, Workload, decode_clip

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(os.path.dirname(HERE), ".cache", "bench-tfrecord")
SHARDS = 8
JPEG_QUALITY = 90


def _key(clips: ClipSet, wl: Workload, fmt: str) -> str:
    h = hashlib.sha256()
    for p in clips.paths:
        h.update(f"{os.path.abspath(p)}:{os.path.getsize(p)}:{os.path.getmtime(p)}\n".encode())
    h.update(f"{fmt}:{wl.clip_len}:{wl.size}:{SEED}:{CLIPS_PER_VIDEO}:{JPEG_QUALITY}".encode())
    if wl.frame_step != 1:  # the keys of consecutive-frame clips stay those written before frame_step counted
        h.update(f":step{wl.frame_step}".encode())
    return f"{fmt}-{wl.clip_len}x{wl.size[0]}x{wl.size[1]}-{h.hexdigest()[:12]}"


def convert(clips: ClipSet, wl: Workload, fmt: str, root: str | None = None) -> dict:
    """The TFRecord files of ``clips`` at ``wl``'s clip shape in ``fmt``, written if not cached
    (under ``root``, by default ``ROOT``).

    Returns the manifest: files, records, bytes, source_bytes, conversion_s, fmt.
    """
    if fmt not in ("jpeg", "raw"):
        raise ValueError(f"fmt must be 'jpeg' or 'raw', not {fmt!r}")
    folder = os.path.join(root or ROOT, _key(clips, wl, fmt))
    manifest = os.path.join(folder, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            return json.load(f)
    import tensorflow as tf

    os.makedirs(folder, exist_ok=True)
    plain = dataclasses.replace(wl, py_iters=0)  # no transform: stored frames
    files = [os.path.join(folder, f"clips-{i:02d}-of-{SHARDS:02d}.tfrecord") for i in range(SHARDS)]
    t0 = time.perf_counter()
    writers = [tf.io.TFRecordWriter(p + ".tmp") for p in files]
    try:
        for sample in range(len(clips)):
            clip, label = decode_clip(clips, plain, 0, sample)
            if fmt == "jpeg":
                frames = [tf.io.encode_jpeg(frame, quality=JPEG_QUALITY).numpy() for frame in clip]
                feature = {"frames": tf.train.Feature(bytes_list=tf.train.BytesList(value=frames))}
            else:
                feature = {"video": tf.train.Feature(bytes_list=tf.train.BytesList(value=[clip.tobytes()]))}
            feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[sample % SHARDS].write(example.SerializeToString())
    finally:
        for w in writers:
            w.close()
    for p in files:
        os.replace(p + ".tmp", p)
    info = {"fmt": fmt, "files": files, "records": len(clips),
            "bytes": sum(os.path.getsize(p) for p in files),
            "source_bytes": sum(os.path.getsize(p) for p in clips.paths),
            "conversion_s": time.perf_counter() - t0,
            "about": (f"{len(clips)} clips of {wl.clip_len}x{wl.size[0]}x{wl.size[1]}, "
                      + (f"JPEG quality {JPEG_QUALITY} per frame" if fmt == "jpeg" else "raw uint8"))}
    with open(manifest + ".tmp", "w") as f:
        json.dump(info, f, indent=1)
    os.replace(manifest + ".tmp", manifest)
    return info


def stored_clips(info: dict, wl: Workload):
    """(sample, clip [T, H, W, 3] uint8) of every record ``convert`` wrote, in sample order:
    what the route delivers, decoded as its reader decodes it."""
    import tensorflow as tf

    files = info["files"]
    clips = {}
    for shard, path in enumerate(files):
        for j, record in enumerate(tf.data.TFRecordDataset(path)):
            ex = tf.train.Example.FromString(record.numpy()).features.feature
            if info["fmt"] == "jpeg":
                clip = np.stack([tf.io.decode_jpeg(f, channels=3).numpy() for f in ex["frames"].bytes_list.value])
            else:
                clip = np.frombuffer(ex["video"].bytes_list.value[0], np.uint8).reshape(wl.shape)
            clips[j * len(files) + shard] = clip
    return sorted(clips.items())
