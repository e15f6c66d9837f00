"""The pipelines a team would pick today instead of shmloader (issue #12), one function each.

Same contract as ``loaders``: ``make(clips, workload, workers, batch_size, pin)`` returns a
``Pipeline`` whose batches reach the same tf.data consumer, and the clips are those of
``workloads.sample_keys`` (same samples, same random starts) except for the TFRecord route,
which reads clips cut once at conversion time.

- grain: ``grain.DataLoader(worker_count=W)`` over a random-access source that decodes with
  decord. ``ReadOptions(num_threads=1)`` so that W processes do W decodes at a time, as for the
  others; "grain-default" keeps grain's own 16 read threads per worker.
- SPDL: ``spdl.pipeline`` with W concurrent decode tasks on W threads, each clip demuxed by
  timestamp and decoded by ``spdl.io`` (FFmpeg releases the GIL); needs FFmpeg's shared libraries
  (Debian: libavcodec59 libavformat59 libavfilter8 libswscale6 libavdevice59).
- torchcodec: torch ``DataLoader(num_workers=W)`` over a dataset that decodes with
  ``torchcodec.decoders.VideoDecoder`` (resize as a decoder transform, one FFmpeg thread).
- TFRecord (JPEG frames or raw clips): ``TFRecordDataset(num_parallel_reads=AUTOTUNE)`` +
  ``map(parse + decode, AUTOTUNE)``; files from ``tfrecord.convert``.

Every peer is optional: ``missing(name)`` says why one cannot run, and the benchmark skips it.
Imports of the peers happen inside the functions (workers of torch and grain import this module).
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from loaders import Pipeline, TorchClips, _batched_dataset, _stack, torch_loader, torch_tensors, why_not
from workloads import SEED, ClipSet, Workload, python_heavy, sample_keys

# What each peer needs importable, and how to get it.
_NEEDS = {
    "grain": ("grain", "pip install grain"),
    "grain-default": ("grain", "pip install grain"),
    "spdl": ("spdl.io", "pip install spdl, and FFmpeg's shared libraries (Debian: libavcodec59 "
                        "libavformat59 libavfilter8 libswscale6 libavdevice59)"),
    "torchcodec": ("torchcodec.decoders", "pip install 'torchcodec==0.13.*' with torch 2.13 (CPU builds; make peers)"),
    "tfrecord-jpeg": ("tensorflow", "pip install tensorflow-cpu"),
    "tfrecord-raw": ("tensorflow", "pip install tensorflow-cpu"),
}
# Records the TFRecord reader's shuffle buffer holds (one epoch of the default bench: 96 clips).
_SHUFFLE_RECORDS = 96


def missing(name: str) -> str | None:
    """None when peer ``name`` can run here, else a one-line reason."""
    return why_not(*_NEEDS[name])


def _epoch_sample(n: int, index: int, cache: dict) -> tuple[int, int]:
    """The ``index``-th key of ``sample_keys(n)`` without walking the stream."""
    epoch, pos = divmod(index, n)
    order = cache.get(epoch)
    if order is None:
        cache.clear()
        order = cache[epoch] = np.random.default_rng((SEED, epoch)).permutation(n)
    return epoch, int(order[pos])


# --------------------------------------------------------------------------- grain
class GrainClips:
    """grain random-access source: record ``i`` is the ``i``-th (epoch, sample) of the stream."""

    EPOCHS = 10_000  # a stream far longer than any run

    def __init__(self, clips: ClipSet, wl: Workload) -> None:
        self.clips, self.wl = clips, wl
        self._orders: dict = {}

    def __len__(self) -> int:
        return len(self.clips) * self.EPOCHS

    def __getitem__(self, index: int) -> dict:
        from workloads import decode_clip

        epoch, sample = _epoch_sample(len(self.clips), int(index), self._orders)
        clip, label = decode_clip(self.clips, self.wl, epoch, sample)
        return {"video": clip, "label": np.int64(label)}

    def __getstate__(self):
        return {"clips": self.clips, "wl": self.wl}

    def __setstate__(self, state):
        self.__init__(state["clips"], state["wl"])


def _grain_batches(clips: ClipSet, wl: Workload, workers: int, batch_size: int, read_threads: int | None):
    """A started grain iterator over batches of numpy arrays, and how to close it."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        # grain 0.2.18's DataLoader reads its absl flags, which only absl.app.run parses: outside
        # an absl app it raises UnparsedFlagAccessError before the first batch.
        flags.FLAGS.mark_as_parsed()
    import grain

    source = GrainClips(clips, wl)
    read = grain.ReadOptions() if read_threads is None else grain.ReadOptions(num_threads=read_threads)
    dl = grain.DataLoader(data_source=source,
                          sampler=grain.samplers.SequentialSampler(len(source), grain.sharding.NoSharding()),
                          operations=[grain.transforms.Batch(batch_size, drop_remainder=True)],
                          worker_count=workers, read_options=read)
    it = iter(dl)

    def close() -> None:
        inner = getattr(it, "_iterator", None)
        for obj in (it, inner):
            if hasattr(obj, "close"):
                obj.close()
                return

    return it, close


def _grain(clips: ClipSet, wl: Workload, workers: int, batch_size: int, read_threads: int | None) -> Pipeline:
    it, close = _grain_batches(clips, wl, workers, batch_size, read_threads)
    stop = threading.Event()

    def batches_gen():
        for batch in it:
            if stop.is_set():
                return
            yield batch

    pipe = _batched_dataset(batches_gen, wl, batch_size, stop)
    pipe.teardown.append(close)
    return pipe


def grain_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    """grain with one read thread per worker process: W decodes at a time."""
    return _grain(clips, wl, workers, batch_size, read_threads=1)


def grain_default(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    """grain as it comes: 16 read threads in each of the W worker processes."""
    return _grain(clips, wl, workers, batch_size, read_threads=None)


# ---------------------------------------------------------------------------- SPDL
def spdl_decode_clip(clips: ClipSet, wl: Workload, epoch: int, sample: int) -> tuple[np.ndarray, int]:
    """``decode_clip`` with spdl.io: demux the clip's time window, decode, scale, to numpy.

    Frames are chosen by timestamp, half a frame either side of the clip's frames, so the
    window holds exactly frames start..start+T-1 whatever the keyframe before them (the
    demuxer hands the decoder packets from that keyframe; frames outside the window are dropped).
    """
    import spdl.io

    path, label = clips.video(sample)
    fps, frames = _video_info(path)
    rng = np.random.default_rng((SEED, epoch, sample))
    start = int(rng.integers(0, frames - wl.span + 1))
    packets = spdl.io.demux_video(path, timestamp=((start - 0.5) / fps, (start + wl.span - 0.5) / fps))
    h, w = wl.size
    filt = spdl.io.get_video_filter_desc(scale_width=w, scale_height=h, scale_mode=None, pix_fmt="rgb24")
    if wl.frame_step > 1:  # every frame_step-th frame of the window by its time, before it is scaled
        filt = f"select='not(mod(round(t*{fps})-{start}\\,{wl.frame_step}))',{filt}"
    decoded = spdl.io.decode_packets(packets, filter_desc=filt,
                                     decode_config=spdl.io.decode_config(decoder_options={"threads": "1"}))
    clip = spdl.io.to_numpy(spdl.io.convert_frames(decoded))
    if clip.shape[0] != wl.clip_len:
        raise RuntimeError(f"{path}: spdl decoded {clip.shape[0]} frames for the window of "
                           f"frames {start}..{start + wl.span - 1}, every {wl.frame_step}")
    if wl.py_iters:
        clip = np.array(clip)  # writable
        python_heavy(clip, wl.py_iters)
    return clip, label


_INFO: dict[str, tuple[float, int]] = {}
_INFO_LOCK = threading.Lock()


def _video_info(path: str) -> tuple[float, int]:
    """(frame rate, frame count) of ``path``, read once per process with decord."""
    with _INFO_LOCK:
        info = _INFO.get(path)
        if info is None:
            import decord

            vr = decord.VideoReader(path, num_threads=1)
            info = _INFO[path] = (float(vr.get_avg_fps()), len(vr))
        return info


def spdl_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    """``spdl.pipeline``: keys -> decode (concurrency W) -> batch -> stack, on W threads."""
    from spdl.pipeline import PipelineBuilder

    for path in clips.paths:  # frame rate and count: like a dataset index, outside the run
        _video_info(path)
    stop = threading.Event()
    pipeline = (PipelineBuilder()
                .add_source(sample_keys(len(clips)))
                .pipe(lambda key: spdl_decode_clip(clips, wl, *key), concurrency=workers)
                .aggregate(batch_size, drop_last=True)
                .pipe(_stack)
                .add_sink(3)
                .build(num_threads=workers))
    pipeline.start()

    def batches_gen():
        for batch in pipeline.get_iterator(timeout=60):
            if stop.is_set():
                return
            yield batch

    pipe = _batched_dataset(batches_gen, wl, batch_size, stop)
    pipe.teardown.append(lambda: pipeline.stop())
    return pipe


# ---------------------------------------------------------------------- torchcodec
def torchcodec_decode_clip(clips: ClipSet, wl: Workload, epoch: int, sample: int) -> tuple[np.ndarray, int]:
    """Open with ``VideoDecoder`` (NHWC, one FFmpeg thread, resize in the decoder), read the frames."""
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import Resize

    path, label = clips.video(sample)
    dec = VideoDecoder(path, dimension_order="NHWC", num_ffmpeg_threads=1, seek_mode="approximate",
                       transforms=[Resize(size=wl.size)])
    rng = np.random.default_rng((SEED, epoch, sample))
    start = int(rng.integers(0, len(dec) - wl.span + 1))
    clip = dec.get_frames_at(list(range(start, start + wl.span, wl.frame_step))).data.numpy()
    if wl.py_iters:
        python_heavy(clip, wl.py_iters)
    return clip, label


def torchcodec_loader(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                      pin: bool = False) -> Pipeline:
    """torch DataLoader (forkserver workers, as ``loaders.torch_loader``) over torchcodec decodes."""
    return torch_loader(clips, wl, workers, batch_size, pin=pin,
                        dataset=TorchClips(clips, wl, torchcodec_decode_clip))


# ------------------------------------------ into PyTorch and JAX, no tf.data (issue 18)
def torchcodec_tensors(clips: ClipSet, wl: Workload, workers: int, batch_size: int,
                       pin: bool = False) -> Pipeline:
    """The torchcodec DataLoader feeding a PyTorch loop: torch tensors, no tf.data."""
    return torch_tensors(clips, wl, workers, batch_size, pin=pin,
                         dataset=TorchClips(clips, wl, torchcodec_decode_clip))


def grain_jax(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    """grain (one read thread per worker, as the ``grain`` row) feeding a JAX loop: each batch
    through ``jax.device_put``, as a JAX training loop over grain does."""
    import jax

    it, close = _grain_batches(clips, wl, workers, batch_size, read_threads=1)
    return Pipeline((jax.device_put(batch) for batch in it), threading.Event(), teardown=[close])


# ------------------------------------------------------------------------ TFRecord
def _tfrecord(clips: ClipSet, wl: Workload, batch_size: int, fmt: str, parallel: bool = True) -> Pipeline:
    """The TFRecord route's pipeline; ``parallel=False``: the same reading, parsing and decoding
    on one thread, files read in turn and nothing prefetched (the route's decode alone)."""
    import tensorflow as tf

    import tfrecord

    info = tfrecord.convert(clips, wl, fmt)
    t, (h, w) = wl.clip_len, wl.size
    if fmt == "jpeg":
        spec = {"frames": tf.io.FixedLenFeature([t], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    else:
        spec = {"video": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        if fmt == "jpeg":
            video = tf.stack([tf.io.decode_jpeg(ex["frames"][i], channels=3) for i in range(t)])
        else:
            video = tf.reshape(tf.io.decode_raw(ex["video"], tf.uint8), (t, h, w, 3))
        video.set_shape((t, h, w, 3))
        if wl.py_iters:
            def transform(clip: np.ndarray) -> np.ndarray:
                clip = np.array(clip)
                python_heavy(clip, wl.py_iters)
                return clip

            video = tf.numpy_function(transform, [video], tf.uint8)
            video.set_shape((t, h, w, 3))
        return {"video": video, "label": ex["label"]}

    auto = tf.data.AUTOTUNE if parallel else None
    ds = tf.data.TFRecordDataset(info["files"], num_parallel_reads=auto)
    ds = ds.repeat().shuffle(_SHUFFLE_RECORDS, seed=SEED)
    ds = ds.map(parse, num_parallel_calls=auto)
    ds = ds.batch(batch_size, drop_remainder=True)
    if parallel:
        ds = ds.prefetch(tf.data.AUTOTUNE)
    pipe = Pipeline(iter(ds), threading.Event())
    pipe.disk = info
    return pipe


def tfrecord_jpeg(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    return _tfrecord(clips, wl, batch_size, "jpeg")


def tfrecord_raw(clips: ClipSet, wl: Workload, workers: int, batch_size: int, pin: bool = False) -> Pipeline:
    return _tfrecord(clips, wl, batch_size, "raw")


def tfrecord_alone(clips: ClipSet, wl: Workload, batch_size: int, fmt: str) -> Pipeline:
    """The TFRecord route in ``fmt`` (``"jpeg"`` or ``"raw"``) on one thread: its decode alone."""
    return _tfrecord(clips, wl, batch_size, fmt, parallel=False)


PEERS: dict[str, Callable[..., Pipeline]] = {
    "tfrecord-jpeg": tfrecord_jpeg,
    "tfrecord-raw": tfrecord_raw,
    "grain": grain_loader,
    "grain-default": grain_default,
    "spdl": spdl_loader,
    "torchcodec": torchcodec_loader,
    "torchcodec-dl": torchcodec_tensors,
    "grain-jax": grain_jax,
}
# tf.data picks the TFRecord route's parallelism (W = auto): measured once per workload.
PEER_FIXED = {"tfrecord-jpeg": "auto", "tfrecord-raw": "auto"}
