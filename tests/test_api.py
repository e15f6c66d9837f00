"""The public surface: names, construction-time errors, errors that name their sample."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import shmloader


def test_public_names():
    assert sorted(shmloader.__all__) == ["ArraySource", "Audio", "Calibration", "CalibrationRow", "FunctionSource",
                                         "HDF5Source", "Loader", "LoaderError", "Pixels", "Reading", "SampleError",
                                         "Sampling", "StateError", "VideoClips", "WorkerDiedError", "calibrate",
                                         "eval_loader", "prepare"]
    for name in shmloader.__all__:
        assert getattr(shmloader, name).__module__.startswith("shmloader")
    import shmloader.tfdata as tfdata

    assert sorted(tfdata.__all__) == ["LoaderCheckpoint", "as_dataset", "distributed_dataset"]
    assert issubclass(shmloader.SampleError, shmloader.LoaderError)
    assert issubclass(shmloader.WorkerDiedError, shmloader.LoaderError)


@pytest.mark.parametrize("kw, msg", [
    (dict(labels=[0, 1]), "labels"), (dict(clip_len=0), "clip_len"), (dict(frame_step=0), "frame_step"),
    (dict(size=(32,)), "size"), (dict(size=(0, 32)), "size"), (dict(sampling="middle"), "sampling"),
    (dict(clips_per_video=0), "clips_per_video"),
])
def test_bad_video_arguments(videos, kw, msg):
    paths, _ = videos
    with pytest.raises(ValueError, match=msg):
        shmloader.VideoClips(paths[:3], **{"size": (32, 32), **kw})


@pytest.mark.parametrize("url", ["rtsp://example.com/a", "concat:/a.mp4|/b.mp4", "file:/etc/passwd"])
def test_urls_refused(url):
    with pytest.raises(ValueError, match="allow_urls"):
        shmloader.VideoClips([url], size=(32, 32))


def test_function_spec_mismatch_fails_at_construction():
    with pytest.raises(ValueError, match="shape"):
        shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(3)}, {"x": ((4,), np.float64)}, 10)
    with pytest.raises(ValueError, match="keys"):
        shmloader.FunctionSource(lambda i, rng: {"y": np.zeros(4)}, {"x": ((4,), np.float64)}, 10)


def test_missing_file_names_path_and_keeps_cause(videos, tmp_path):
    paths, _ = videos
    missing = str(tmp_path / "nope.mp4")
    clips = shmloader.VideoClips([paths[0], missing], clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=2, workers=2) as loader:
        with pytest.raises(shmloader.SampleError) as info:
            list(loader)
    err = info.value
    assert missing in str(err) and err.index == 1 and err.exc_type == "FileNotFoundError"
    assert isinstance(err.__cause__, shmloader._errors.RemoteTraceback)
    assert "reader.py" in err.__cause__.tb and "FileNotFoundError" in err.__cause__.tb


def test_user_function_error_keeps_type_and_message():
    def fn(i, rng):
        if i == 5:
            raise KeyError("row 5 is missing")
        return {"x": np.zeros(2)}

    src = shmloader.FunctionSource(fn, {"x": ((2,), np.float64)}, 8)
    with shmloader.Loader(src, batch_size=2, workers=2) as loader:
        with pytest.raises(shmloader.SampleError, match="KeyError: 'row 5 is missing'") as info:
            list(loader)
    assert info.value.index == 5
    with pytest.raises(shmloader.LoaderError):
        next(iter(loader))  # stays stopped


def test_killed_worker_raises_worker_died():
    def slow(i, rng):
        import time

        time.sleep(0.2)
        return {"x": np.zeros(2)}

    src = shmloader.FunctionSource(slow, {"x": ((2,), np.float64)}, 40, check=False)
    with shmloader.Loader(src, batch_size=2, workers=2) as loader:
        it = iter(loader)
        next(it)
        victim = loader.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(shmloader.WorkerDiedError, match="SIGKILL") as info:
            for _ in it:
                pass
    assert info.value.pid == victim and "sample" in info.value.holding
