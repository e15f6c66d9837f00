"""The loaders compared, one function each, all feeding the same tf.data consumer, and the rows
that feed PyTorch or JAX instead (section 7, issue 18).

Each function builds a pipeline for (clips, workload, workers, batch size) and returns a
``Pipeline``: ``next(pipe)`` gives a batch ``{"video": [B, T, H, W, 3] uint8, "label": [B]
int64}`` as tf.data delivers it (as torch tensors or jax.Arrays for the framework rows);
``pids()`` are the processes whose CPU counts as "workers".
``pin=True`` (the ``--pin`` diagnostic) puts worker process i on core i; loaders without worker
processes ignore it.

TensorFlow and torch are imported inside the functions: torch's forkserver workers import
this module and must not pay for TensorFlow.

NOTE [ Closing a from_generator pipeline ]
Dropping a tf.data iterator waits for its prefetch thread's call into the generator to
return. A generator blocked on producers that were stopped first never returns, and the
program hangs. So every generator here waits with short timeouts and returns once the
pipeline's ``stop`` event is set, and ``Pipeline.close`` runs in this order: set ``stop``,
drop the iterator, then stop producers (threads, torch workers, shmloader's workers).
"""

from __future__ import annotations

import inspect
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from measure import pin_processes
from workloads import CLIPS_PER_VIDEO, ClipSet, SharedKeys, Workload, decode_clip, python_heavy, sample_keys, shm_transform

# Clips the thread loader's queue holds: two batches, so producers never wait on one stack.
_QUEUE_BATCHES = 2
# How often a blocked generator or producer looks at the stop event.
_POLL_S = 0.05


@dataclass
class Pipeline:
    batches: Iterator[dict] | None
    stop: threading.Event
    pids: Callable[[], list[int]] = lambda: []
    teardown: list[Callable[[], None]] = field(default_factory=list)
    stats: Callable[[], dict] | None = None
    disk: dict | None = None  # the TFRecord route's files: bytes, source_bytes, conversion_s
    epoch_batches: int = 1  # > 1: measured over whole epochs of this many batches (measure.run_pipeline)

    def __next__(self) -> dict:
        return next(self.batches)

    def close(self) -> None:
        """NOTE [ Closing a from_generator pipeline ]. Safe to call again."""
        self.stop.set()
        self.batches = None
        while self.teardown:
            self.teardown.pop(0)()


def _batch_signature(wl: Workload, batch_size: int):
    import tensorflow as tf

    return {"video": tf.TensorSpec((batch_size, *wl.shape), tf.uint8),
            "label": tf.TensorSpec((batch_size,), tf.int64)}


def _stack(items: list[tuple[np.ndarray, int]]) -> dict[str, np.ndarray]:
    return {"video": np.stack([clip for clip, _ in items]),
            "label": np.array([label for _, label in items], np.int64)}


def _batched_dataset(batches_gen, wl: Workload, batch_size: int, stop: threading.Event) -> Pipeline:
    """``from_generator`` of whole batches, then ``prefetch(AUTOTUNE)``."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_generator(batches_gen, output_signature=_batch_signature(wl, batch_size))
    return Pipeline(iter(ds.prefetch(tf.data.AUTOTUNE)), stop)


# ----------------------------------------------------------------------- 1. naive
def naive(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
          pin: bool = False) -> Pipeline:
    """``from_generator`` over a serial decode loop, ``batch``, ``prefetch``; always one decoder."""
    import tensorflow as tf

    stop = threading.Event()

    def clips_gen():
        for epoch, sample in sample_keys(len(clips)):
            if stop.is_set():
                return
            clip, label = decode_clip(clips, wl, epoch, sample)
            yield {"video": clip, "label": label}

    sig = {"video": tf.TensorSpec(wl.shape, tf.uint8), "label": tf.TensorSpec((), tf.int64)}
    ds = tf.data.Dataset.from_generator(clips_gen, output_signature=sig)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return Pipeline(iter(ds), stop)


# ---------------------------------------------------------------- 2. tf map + AUTOTUNE
def tf_map(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
           pin: bool = False) -> Pipeline:
    """Keys from ``from_generator``, ``map(tf.numpy_function(decode), AUTOTUNE)``, batch,
    prefetch. tf.data picks the parallelism (``workers`` is not used)."""
    import tensorflow as tf

    stop = threading.Event()

    def keys_gen():
        for key in sample_keys(len(clips)):
            if stop.is_set():
                return
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
    return Pipeline(iter(ds), stop)


# ------------------------------------------------------------- 3. threads + queue
def threads(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
            pin: bool = False) -> Pipeline:
    """``workers`` threads decode into a bounded ``queue.Queue``; the generator stacks batches."""
    keys = SharedKeys(len(clips))
    q: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES * batch_size)
    stop = threading.Event()
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            while not stop.is_set():
                item = decode_clip(clips, wl, *next(keys))
                while not stop.is_set():
                    try:
                        q.put(item, timeout=_POLL_S)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # the consumer raises it instead of waiting forever
            failed.append(e)
            stop.set()

    def batches_gen():
        items: list = []
        while not stop.is_set():
            try:
                items.append(q.get(timeout=_POLL_S))
            except queue.Empty:
                continue
            if len(items) == batch_size:
                yield _stack(items)
                items = []
        if failed:
            raise failed[0]

    pool = [threading.Thread(target=produce, daemon=True, name=f"bench-decode-{i}")
            for i in range(workers)]
    for t in pool:
        t.start()

    def join() -> None:
        for t in pool:
            t.join(timeout=10)

    pipe = _batched_dataset(batches_gen, wl, batch_size, stop)
    pipe.teardown.append(join)
    return pipe


# ---------------------------------------------------------------- 4. torch DataLoader
class TorchClips:
    """Map-style dataset: key ``epoch * n + sample`` -> (clip, label), decoded in the worker by
    ``decode(clips, wl, epoch, sample)`` (a module-level function: it is pickled to the workers)."""

    def __init__(self, clips: ClipSet, wl: Workload, decode=decode_clip) -> None:
        self.clips, self.wl, self.decode = clips, wl, decode

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, key: int):
        import torch

        epoch, sample = divmod(int(key), len(self.clips))
        clip, label = self.decode(self.clips, self.wl, epoch, sample)
        return torch.from_numpy(clip), label


class _EndlessKeys:
    """Sampler: epoch after epoch of ``sample_keys``, each encoded as one int."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (epoch * self.n + sample for epoch, sample in sample_keys(self.n))


def why_not(module: str, how: str) -> str | None:
    """None when ``module`` imports, else a one-line reason that ends with ``how`` to get it."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as e:  # ImportError, or a library that fails to load (CUDA build, no FFmpeg)
        first = str(e).splitlines()[0] if str(e) else ""
        return f"{module} does not import ({type(e).__name__}: {first[:160]}); {how}"
    return None


def torch_missing() -> str | None:
    """None when torch imports, else why not."""
    return why_not("torch", "pip install 'torch>=2.3' (a CPU build on a machine without a GPU)")


def start_forkserver() -> None:
    """Start the forkserver now, with the worker-side modules preloaded; its pid and the resource
    tracker's stay out of every measurement (``measure.IGNORED_PIDS``).

    torch's workers fork from it: preloading torch and decord there gives them the start-up
    that fork would, without forking TensorFlow.
    """
    import multiprocessing as mp
    from multiprocessing import forkserver, resource_tracker

    import measure

    mp.set_forkserver_preload(["numpy", "decord", "torch", "torchcodec.decoders", "workloads", "loaders",
                               "peers"])
    p = mp.get_context("forkserver").Process(target=int)
    p.start()
    p.join()
    for pid in (forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid):
        if pid:
            measure.IGNORED_PIDS.add(pid)


def _torch_workers(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool, dataset):
    """A started ``DataLoader`` iterator (forkserver workers) and its worker pids."""
    import multiprocessing as mp

    from torch.utils.data import DataLoader

    dl = DataLoader(dataset or TorchClips(clips, wl), batch_size=batch_size, sampler=_EndlessKeys(len(clips)),
                    num_workers=workers, multiprocessing_context=mp.get_context("forkserver"),
                    drop_last=True, prefetch_factor=2)
    dl_iter = iter(dl)  # starts the workers
    if pin:
        pin_processes([w.pid for w in dl_iter._workers])

    def pids() -> list[int]:
        return [w.pid for w in getattr(dl_iter, "_workers", []) if w.is_alive()]

    return dl_iter, pids


def torch_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                 pin: bool = False, dataset=None) -> Pipeline:
    """``torch.utils.data.DataLoader(num_workers=workers)`` with forkserver workers.

    Not the Linux default, fork: forking a process that runs TensorFlow's thread pools is
    unsafe. The forkserver (started by the CLI) preloads torch and decord, so workers start
    about as fast as forked ones; spawn would import torch afresh in each. ``dataset`` replaces
    the decord dataset (``peers.torchcodec_loader``).
    """
    dl_iter, pids = _torch_workers(clips, wl, workers, batch_size, pin, dataset)
    stop = threading.Event()

    def batches_gen():
        for video, label in dl_iter:
            if stop.is_set():
                return
            yield {"video": video.numpy(), "label": label.numpy().astype(np.int64)}

    pipe = _batched_dataset(batches_gen, wl, batch_size, stop)
    pipe.pids = pids
    pipe.teardown.append(dl_iter._shutdown_workers)
    return pipe


def torch_tensors(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                  pin: bool = False, dataset=None) -> Pipeline:
    """The same ``DataLoader`` feeding a PyTorch loop: its batches as torch tensors, no tf.data."""
    dl_iter, pids = _torch_workers(clips, wl, workers, batch_size, pin, dataset)
    batches = ({"video": video, "label": label} for video, label in dl_iter)
    return Pipeline(batches, threading.Event(), pids=pids, teardown=[dl_iter._shutdown_workers])


# ------------------------------------------------------------- 5. decord VideoLoader
def video_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                 pin: bool = False) -> Pipeline:
    """``decord.VideoLoader`` with one CPU context per worker and ``shuffle=2`` (random order).

    It chooses its own clips: consecutive ``clip_len``-frame chunks at fixed offsets rather than
    a random start per clip, so its frames differ from the other loaders' (the decode cost is
    the same on average: every clip seeks to the keyframe at frame 0 and decodes forward).
    The transform runs in the generator, in the main process.
    """
    import decord

    h, w = wl.size
    vl = decord.VideoLoader(list(clips.paths), ctx=[decord.cpu(i) for i in range(workers)],
                            shape=(wl.clip_len, h, w, 3), interval=0, skip=0, shuffle=2)
    stop = threading.Event()

    def batches_gen():
        items = []
        while not stop.is_set():
            for data, index in vl:
                clip = data.asnumpy()
                if wl.py_iters:
                    python_heavy(clip, wl.py_iters)
                items.append((clip, clips.labels[int(index.asnumpy()[0, 0])]))
                if len(items) == batch_size:
                    yield _stack(items)
                    items = []
                if stop.is_set():
                    return
            vl.reset()

    return _batched_dataset(batches_gen, wl, batch_size, stop)


# --------------------------------------------------------------------- 6. shmloader
def _shm_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool,
                evaluation: bool = False, **options):
    """``shmloader.Loader(VideoClips(...))`` over the clip set, ``CLIPS_PER_VIDEO`` random clips
    of each video at the workload's size; ``options`` go to ``VideoClips`` (``group_clips=True``:
    the clips of a video decoded in one pass, still one clip per sample). ``evaluation``:
    ``shmloader.eval_loader`` instead."""
    import shmloader

    options = {"clips_per_video": CLIPS_PER_VIDEO, "size": wl.size, "sampling": "random", **options}
    source = shmloader.VideoClips(list(clips.paths), list(clips.labels), clip_len=wl.clip_len,
                                  frame_step=wl.frame_step, **options)
    if evaluation:
        return shmloader.eval_loader(source, batch_size=batch_size, workers=workers)
    transform = shm_transform(wl.py_iters) if wl.py_iters else None
    pinned = pin and "pin_workers" in inspect.signature(shmloader.Loader).parameters
    loader = shmloader.Loader(source, batch_size=batch_size, workers=workers, shuffle=True,
                              seed=0, epochs=None, drop_remainder=True, transform=transform,
                              **({"pin_workers": True} if pinned else {}))  # pinned before any thread starts
    if pin and not pinned:
        pin_processes(loader.worker_pids())
    return loader


def _loader_pipeline(loader, batches, whole_epochs: bool = False) -> Pipeline:
    return Pipeline(batches, threading.Event(), pids=loader.worker_pids, teardown=[loader.close],
                    stats=loader.stats, epoch_batches=len(loader) if whole_epochs else 1)


def shm(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False,
        whole_epochs: bool = False, **options) -> Pipeline:
    """``shmloader.Loader(VideoClips(...), workers=workers).as_dataset()``; ``whole_epochs``:
    measured over whole epochs (grouped decode delivers in bursts).

    Its generator never blocks without a deadline, so dropping the iterator first is safe
    (NOTE [ Closing a from_generator pipeline ]); the loader is closed after.
    """
    loader = _shm_loader(clips, wl, workers, batch_size, pin, **options)
    return _loader_pipeline(loader, iter(loader.as_dataset()), whole_epochs)


def shm_grouped(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    """``shm`` with ``group_clips=True``: the ``CLIPS_PER_VIDEO`` clips of a video decoded in one
    pass (one clip a sample still), measured over whole epochs."""
    return shm(clips, wl, workers, batch_size, pin, whole_epochs=True, group_clips=True)


# ------------------------------------------- 7. into PyTorch and JAX, no tf.data (issue 18)
def shm_torch(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False,
              grouped: bool = False) -> Pipeline:
    """``loader.as_torch()``: torch tensors over the ring's slots (no pin_memory: no CUDA here)."""
    loader = _shm_loader(clips, wl, workers, batch_size, pin, group_clips=grouped)
    return _loader_pipeline(loader, iter(loader.as_torch()))


def shm_torch_grouped(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                      pin: bool = False) -> Pipeline:
    return shm_torch(clips, wl, workers, batch_size, pin, grouped=True)


def shm_jax(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False,
            grouped: bool = False) -> Pipeline:
    """``shmloader.jax.batches(loader)``: jax.Arrays (on the CPU backend, over the slots)."""
    import shmloader.jax

    loader = _shm_loader(clips, wl, workers, batch_size, pin, group_clips=grouped)
    return _loader_pipeline(loader, shmloader.jax.batches(loader))


def shm_jax_grouped(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                    pin: bool = False) -> Pipeline:
    return shm_jax(clips, wl, workers, batch_size, pin, grouped=True)


def framework_missing(name: str) -> str | None:
    """None when the framework row ``name`` can run here, else why not."""
    return next(filter(None, (why_not(module, how) for module, how in FRAMEWORK_NEEDS[name])), None)


# What each framework row needs importable, and how to get it.
_TORCH = ("torch", "pip install 'shmloader[torch]' (torch>=2.3)")
_JAX = ("jax", "pip install 'shmloader[jax]'")
FRAMEWORK_NEEDS = {
    "shm-torch": (_TORCH,), "shm-torch-grouped": (_TORCH,), "torch-dl": (_TORCH,),
    "torchcodec-dl": (_TORCH, ("torchcodec.decoders", "make peers (torchcodec 0.13, CPU)")),
    "shm-jax": (_JAX,), "shm-jax-grouped": (_JAX,),
    "grain-jax": (_JAX, ("grain", "make peers (grain)")),
}


LOADERS: dict[str, Callable[..., Pipeline]] = {
    "naive": naive,
    "tf-map": tf_map,
    "threads": threads,
    "torch": torch_loader,
    "videoloader": video_loader,
    "shmloader": shm,
    "shmloader-grouped": shm_grouped,
    "shm-torch": shm_torch,
    "shm-torch-grouped": shm_torch_grouped,
    "torch-dl": torch_tensors,
    "shm-jax": shm_jax,
    "shm-jax-grouped": shm_jax_grouped,
}

# Loaders whose parallelism does not follow ``workers``: measured once per workload.
FIXED_PARALLELISM = {"naive": "1", "tf-map": "auto"}
