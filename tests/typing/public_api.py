"""What users' editors and type checkers see for the main calls: tests/test_typing.py runs mypy
on this file and compares each ``reveal_type`` with the comment ``# -> type`` beside it. Never run."""

import numpy as np
from typing_extensions import reveal_type

import shmloader
import shmloader.jax
import shmloader.lerobot
import shmloader.qwen
import shmloader.sampling
import shmloader.samples
import shmloader.torch

paths, labels = shmloader.samples.make_videos("videos")
reveal_type(paths)  # -> list[str]
clips = shmloader.VideoClips(paths, labels, clip_len=8, size=(64, 64))
reveal_type(clips)  # -> shmloader.clips.description.VideoClips
reveal_type(shmloader.VideoClips.from_folder("videos"))  # -> shmloader.clips.description.VideoClips
reveal_type(clips.for_eval())  # -> shmloader.clips.description.VideoClips
reveal_type(clips.sampling)  # -> shmloader.clips.options.Sampling
reveal_type(clips.sampling.length)  # -> int
grouped = shmloader.VideoClips(paths, sampling=shmloader.Sampling(clip_len=8), pixels=shmloader.Pixels(size=(64, 64)))
reveal_type(grouped.with_options(audio_rate=16000))  # -> shmloader.clips.description.VideoClips
loader = shmloader.Loader(clips, batch_size=4, workers=2)
reveal_type(loader)  # -> shmloader._loader.Loader
for batch in loader:
    reveal_type(batch)  # -> dict[str, numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]]]
reveal_type(loader.stats())  # -> dict[str, Any]
reveal_type(loader.state())  # -> dict[str, Any]
reveal_type(loader.element_spec)  # -> dict[str, tuple[tuple[int | None, ...], numpy.dtype[Any]]]
reveal_type(loader.as_torch())  # -> shmloader.torch.TorchLoader
reveal_type(shmloader.torch.as_torch(loader, pin_memory=True))  # -> shmloader.torch.TorchLoader
for tensors in loader.as_torch():
    reveal_type(tensors)  # -> dict[str, torch._tensor.Tensor]
reveal_type(loader.as_keras())  # -> shmloader._keras.KerasDataset
reveal_type(loader.as_dataset())  # -> Any  (TensorFlow ships no types)
for arrays in shmloader.jax.batches(loader):
    reveal_type(arrays)  # -> dict[str, jax._src.basearray.Array]
reveal_type(shmloader.eval_loader(clips, batch_size=4))  # -> shmloader._loader.Loader
reveal_type(shmloader.calibrate(clips, lambda batch: None, batch_size=4, seconds=5))  # -> shmloader._calibrate.Calibration
reveal_type(shmloader.ArraySource({"x": np.zeros((10, 3))}))  # -> shmloader._arrays.ArraySource
reveal_type(shmloader.sampling.clip_frames)  # -> def (num_frames: int, pts: numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]] | None, *, clip_len: int, frame_step: int, fps: float | None, sampling: str, clips: list[int], total_clips: int, short_video: str, rng: numpy.random._generator.Generator, span: tuple[float, float] | None =) -> numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]]
reveal_type(shmloader.qwen.plan(360, 30.0, 360, 640))  # -> shmloader.qwen.inputs.VideoPlan
reveal_type(shmloader.qwen.plan(360, 30.0, 360, 640).grid_thw)  # -> tuple[int, int, int]
reveal_type(shmloader.qwen.frame_size(360, 640, 24))  # -> tuple[int, int]
reveal_type(shmloader.qwen.clips(["a.mp4"]))  # -> shmloader.video.planned.PlannedVideos
reveal_type(shmloader.lerobot.dataset("ds"))  # -> shmloader.lerobot.source.LeRobotSource
reveal_type(shmloader.qwen.normalize(np.zeros((4, 1176), np.uint8)))  # -> numpy.ndarray[Any, numpy.dtype[numpy.floating[numpy._typing._nbit_base._32Bit]]]
