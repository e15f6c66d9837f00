"""The loaders compared, one function each, all feeding the same tf.data consumer.

Each function builds a pipeline for (clips, workload, workers, batch size) and returns a
``Pipeline``: an iterator of batches ``{"video": [B, T, H, W, 3] uint8, "label": [B] int64}``
as tf.data delivers them, the pids whose CPU counts as "workers", and a ``close``.

TensorFlow and torch are imported inside the functions: torch's forkserver workers import
this module and must not pay for TensorFlow.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from workloads import ClipSet, SharedKeys, Workload, decode_clip, sample_keys, shm_transform

# Clips the thread loader's queue holds: two batches, so producers never wait on one stack.
_QUEUE_BATCHES = 2


@dataclass
class Pipeline:
    batches: Iterator[dict]
    pids: Callable[[], list[int]] = lambda: []
    close: Callable[[], None] = lambda: None
    notes: list[str] = field(default_factory=list)


def _batch_signature(wl: Workload, batch_size: int):
    import tensorflow as tf

    return {"video": tf.TensorSpec((batch_size, *wl.shape), tf.uint8),
            "label": tf.TensorSpec((batch_size,), tf.int64)}


def _dataset_pipeline(ds, **kw) -> Pipeline:
    it = iter(ds)

    def close() -> None:
        nonlocal it
        it = None

    return Pipeline(batches=it, close=close, **kw)


# ----------------------------------------------------------------------- 1. naive
def naive(clips: ClipSet, wl: Workload, workers: int, batch_size: int) -> Pipeline:
    """``from_generator`` over a serial decode loop; ``workers`` is ignored (always 1)."""
    import tensorflow as tf

    def clips_gen():
        for epoch, sample in sample_keys(len(clips)):
            clip, label = decode_clip(clips, wl, epoch, sample)
            yield {"video": clip, "label": label}

    sig = {"video": tf.TensorSpec(wl.shape, tf.uint8), "label": tf.TensorSpec((), tf.int64)}
    ds = tf.data.Dataset.from_generator(clips_gen, output_signature=sig)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return _dataset_pipeline(ds)


# ---------------------------------------------------------------- 2. tf map + AUTOTUNE
def tf_map(clips: ClipSet, wl: Workload, workers: int, batch_size: int) -> Pipeline:
    """Indices from ``from_generator``, ``map(tf.numpy_function(decode), AUTOTUNE)``, batch,
    prefetch. tf.data picks the parallelism; ``workers`` is ignored."""
    import tensorflow as tf

    def keys_gen():
        for key in sample_keys(len(clips)):
            yield np.asarray(key, np.int64)

    def decode(key: np.ndarray):
        clip, label = decode_clip(clips, wl, int(key[0]), int(key[1]))
        return clip, np.int64(label)

    def tf_decode(key):
        clip, label = tf.numpy_function(decode, [key], [tf.uint8, tf.int64])
        clip.set_shape(wl.shape)
        label.set_shape(())
        return {"video": clip, "label": label}

    ds = tf.data.Dataset.from_generator(keys_gen, output_signature=tf.TensorSpec((2,), tf.int64))
    ds = ds.map(tf_decode, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return _dataset_pipeline(ds)


# ------------------------------------------------------------- 3. threads + queue
def threads(clips: ClipSet, wl: Workload, workers: int, batch_size: int) -> Pipeline:
    """``workers`` threads decode into a bounded ``queue.Queue``; a generator stacks batches."""
    import tensorflow as tf

    keys = SharedKeys(len(clips))
    q: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES * batch_size)
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            item = decode_clip(clips, wl, *next(keys))
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    pass

    pool = [threading.Thread(target=produce, daemon=True, name=f"bench-decode-{i}")
            for i in range(workers)]
    for t in pool:
        t.start()

    def batches_gen():
        while True:
            items = [q.get() for _ in range(batch_size)]
            yield {"video": np.stack([c for c, _ in items]),
                   "label": np.array([lab for _, lab in items], np.int64)}

    ds = tf.data.Dataset.from_generator(batches_gen, output_signature=_batch_signature(wl, batch_size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    pipe = _dataset_pipeline(ds)
    close_it = pipe.close

    def close() -> None:
        close_it()
        stop.set()
        while True:  # unblock producers waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                break
        for t in pool:
            t.join(timeout=10)

    pipe.close = close
    return pipe


# ---------------------------------------------------------------- 4. torch DataLoader
class _TorchClips:
    """Map-style dataset: key ``epoch * n + sample`` -> (clip, label), decoded in the worker."""

    def __init__(self, clips: ClipSet, wl: Workload) -> None:
        self.clips, self.wl = clips, wl

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, key: int):
        import torch

        epoch, sample = divmod(int(key), len(self.clips))
        clip, label = decode_clip(self.clips, self.wl, epoch, sample)
        return torch.from_numpy(clip), label


class _EndlessKeys:
    """Sampler: epoch after epoch of ``sample_keys``, encoded as one int per sample."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (epoch * self.n + sample for epoch, sample in sample_keys(self.n))


def torch_available() -> str | None:
    """None when torch imports, else why not."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"torch is not importable ({type(e).__name__}: {e}); pip install torch==2.13.0 (CPU)"
    return None


def torch_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int) -> Pipeline:
    """``torch.utils.data.DataLoader(num_workers=workers)``, forkserver workers, into from_generator.

    forkserver, not the Linux default fork: forking a process that runs TensorFlow's thread
    pools is unsafe, and spawn would re-import this benchmark in every worker.
    """
    import multiprocessing as mp

    import tensorflow as tf
    import torch
    from torch.utils.data import DataLoader

    ctx = mp.get_context("forkserver")
    dl = DataLoader(_TorchClips(clips, wl), batch_size=batch_size, sampler=_EndlessKeys(len(clips)),
                    num_workers=workers, multiprocessing_context=ctx, drop_last=True,
                    prefetch_factor=2, persistent_workers=False)
    dl_iter = iter(dl)

    def batches_gen():
        for video, label in dl_iter:
            yield {"video": video.numpy(), "label": label.numpy().astype(np.int64)}

    ds = tf.data.Dataset.from_generator(batches_gen, output_signature=_batch_signature(wl, batch_size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    pipe = _dataset_pipeline(ds)
    close_it = pipe.close

    def pids() -> list[int]:
        return [w.pid for w in getattr(dl_iter, "_workers", []) if w.is_alive()]

    def close() -> None:
        close_it()
        shutdown = getattr(dl_iter, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    pipe.pids, pipe.close = pids, close
    del torch
    return pipe


# ------------------------------------------------------------- 5. decord VideoLoader
def video_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int) -> Pipeline:
    """``decord.VideoLoader`` with one CPU context per worker, ``shuffle=2`` (random clip order).

    It picks its own clips: consecutive ``clip_len``-frame chunks at fixed offsets, not a random
    start per clip, so its frames differ from the other loaders' (same decode cost on average:
    both seek to the keyframe at frame 0 and decode forward). Transform runs in the consumer.
    """
    import decord
    import tensorflow as tf

    h, w = wl.size
    vl = decord.VideoLoader(list(clips.paths), ctx=[decord.cpu(i) for i in range(workers)],
                            shape=(wl.clip_len, h, w, 3), interval=0, skip=0, shuffle=2)
    from workloads import python_heavy

    def clips_iter():
        while True:
            for data, index in vl:
                clip = data.asnumpy()
                if wl.py_iters:
                    python_heavy(clip, wl.py_iters)
                yield clip, clips.labels[int(index.asnumpy()[0, 0])]
            vl.reset()

    def batches_gen():
        it = clips_iter()
        while True:
            items = [next(it) for _ in range(batch_size)]
            yield {"video": np.stack([c for c, _ in items]),
                   "label": np.array([lab for _, lab in items], np.int64)}

    ds = tf.data.Dataset.from_generator(batches_gen, output_signature=_batch_signature(wl, batch_size))
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return _dataset_pipeline(ds)


# --------------------------------------------------------------------- 6. shmloader
def shm(clips: ClipSet, wl: Workload, workers: int, batch_size: int) -> Pipeline:
    """``shmloader.Loader(VideoClips(...), workers=workers).as_dataset()``."""
    import shmloader

    source = shmloader.VideoClips(list(clips.paths), list(clips.labels), clip_len=wl.clip_len,
                                  clips_per_video=len(clips) // len(clips.paths),
                                  sampling="random", size=wl.size)
    transform = shm_transform(wl.py_iters) if wl.py_iters else None
    loader = shmloader.Loader(source, batch_size=batch_size, workers=workers, shuffle=True,
                              seed=0, epochs=None, drop_remainder=True, transform=transform)
    pipe = _dataset_pipeline(loader.as_dataset())
    close_it = pipe.close

    def close() -> None:
        close_it()
        loader.close()

    pipe.pids, pipe.close = loader.worker_pids, close
    pipe.stats = loader.stats  # type: ignore[attr-defined]
    return pipe


LOADERS: dict[str, Callable[..., Pipeline]] = {
    "naive": naive,
    "tf-map": tf_map,
    "threads": threads,
    "torch": torch_loader,
    "videoloader": video_loader,
    "shmloader": shm,
}

# Loaders whose parallelism does not follow ``workers``: measured once per workload.
FIXED_PARALLELISM = {"naive": "1", "tf-map": "auto"}
