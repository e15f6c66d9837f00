"""Bad input: every damaged or wrong file ends in an error naming it, or a counted skip."""

from __future__ import annotations

import os

import av
import numpy as np
import pytest

import shmloader
from shmloader.video.samples import frame_image, write_video

pytestmark = pytest.mark.timeout(60)


def audio_only(path):
    with av.open(str(path), "w") as c:
        stream = c.add_stream("aac", rate=44100)
        for i in range(20):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 44100, i * 1024
            for p in stream.encode(frame):
                c.mux(p)
        for p in stream.encode():
            c.mux(p)


def over_reported(path, frames=40):
    """An MP4 whose index (written first, 'faststart') lists more frames than the file still holds."""
    full = path.with_suffix(".full.mp4")
    with av.open(str(full), "w", options={"movflags": "faststart"}) as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 128, 96, "yuv420p"
        for i in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(frame_image(9, i, 96, 128), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    data = full.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.8)])


def make_bad(kind, tmp_path, good):
    p = tmp_path / f"{kind}.mp4"
    if kind == "missing":
        pass
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "random":
        p.write_bytes(os.urandom(20000))
    elif kind == "truncated":
        data = open(good, "rb").read()
        p.write_bytes(data[: len(data) // 2])
    elif kind == "text":
        p.write_text("this is not a video\n" * 200)
    elif kind == "audio_only":
        audio_only(p)
    elif kind == "short":
        write_video(p, 5, frames=3)
    elif kind == "over_reported":
        over_reported(p)
    elif kind == "directory":
        p.mkdir()
    return str(p)


KINDS = ["missing", "empty", "random", "truncated", "text", "audio_only", "short", "over_reported", "directory"]


def clips_with_bad(kind, videos, tmp_path):
    """(good, bad, good) videos; returns the clips and the bad file's path."""
    paths, _ = videos
    bad = make_bad(kind, tmp_path, paths[0])
    # Every clip of the over-reported file reaches past what remains of it.
    clip_len = 36 if kind == "over_reported" else 4
    return shmloader.VideoClips([paths[0], bad, paths[1]], clip_len=clip_len, size=(32, 40)), bad


@pytest.mark.parametrize("kind", KINDS)
def test_bad_file_raises_naming_path(kind, videos, tmp_path):
    clips, bad = clips_with_bad(kind, videos, tmp_path)
    with shmloader.Loader(clips, batch_size=3, workers=2, timeout=20) as loader:
        with pytest.raises(shmloader.SampleError) as info:
            list(loader)
    assert bad in str(info.value) and info.value.index == 1
    assert info.value.__cause__ is not None and info.value.reason
    if kind == "short":
        assert "shorter than one clip" in str(info.value)


# What a user reads for each kind of bad file: the cause in words, never FFmpeg's error number.
REASONS = {"missing": "No such file or directory", "empty": "empty file (0 bytes)", "random": "not a video",
           "truncated": "cut short: no index (moov box) found", "text": "not a video",
           "audio_only": "no video stream", "directory": "not a file"}


@pytest.mark.parametrize("kind", sorted(REASONS))
def test_bad_file_error_says_the_cause_in_words(kind, videos, tmp_path):
    clips, bad = clips_with_bad(kind, videos, tmp_path)
    with shmloader.Loader(clips, batch_size=3, workers=1, timeout=20) as loader:
        with pytest.raises(shmloader.SampleError) as info:
            list(loader)
    message = str(info.value)
    assert REASONS[kind] in message and bad in message and "1094995529" not in message, message


@pytest.mark.parametrize("kind", KINDS)
def test_bad_file_skipped_and_counted(kind, videos, tmp_path, caplog):
    clips, _ = clips_with_bad(kind, videos, tmp_path)
    with shmloader.Loader(clips, batch_size=2, workers=2, on_error="skip", timeout=20) as loader:
        got = sorted(int(i) for b in loader for i in b["index"])
        assert loader.stats()["skipped"] == 1 and loader.stats()["samples"] == 2
    assert got == [0, 2]
    assert "were skipped" not in caplog.text  # one of three: no warning about the epoch


def random_files(folder, n):
    paths = []
    for i in range(n):
        p = folder / f"random{i}.mp4"
        p.write_bytes(os.urandom(5000))
        paths.append(str(p))
    return paths


@pytest.mark.timeout(30)
@pytest.mark.parametrize("epochs", [None, 3])
def test_every_file_bad_raises_instead_of_spinning(tmp_path, epochs):
    """Nothing but random bytes, skip mode: a LoaderError that says so, not an endless loop
    (epochs=None) or a silent empty pass (epochs=3)."""
    clips = shmloader.VideoClips(random_files(tmp_path, 6), clip_len=4, size=(64, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, on_error="skip", epochs=epochs) as loader:
        with pytest.raises(shmloader.LoaderError, match=r"every sample of epoch 0 failed: 6 tried, 6 skipped") as info:
            next(iter(loader))
        assert loader.stats()["batches"] == 0
        with pytest.raises(shmloader.LoaderError):
            next(iter(loader))  # stays stopped
    assert str(tmp_path / "random") in str(info.value)  # the first reasons name the files


def dies_or_raises(i, rng):
    if i % 2:
        os.abort()
    raise OSError(f"row {i} unreadable")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [True, False])
def test_every_sample_failing_raises_whatever_the_failure(ordered):
    src = shmloader.FunctionSource(dies_or_raises, {"x": ((), np.int64)}, 4, check=False)
    with shmloader.Loader(src, batch_size=2, workers=2, on_error="skip", epochs=None, ordered=ordered) as loader:
        with pytest.raises(shmloader.LoaderError, match=r"4 tried, 4 skipped.*(SIGABRT|unreadable)"):
            list(loader)


def test_mostly_bad_epoch_warns_with_the_share(videos, tmp_path, caplog):
    paths, _ = videos
    clips = shmloader.VideoClips(paths[:2] + random_files(tmp_path, 4), clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=2, workers=2, on_error="skip", epochs=2) as loader:
        got = sorted(int(i) for b in loader for i in b["index"])
    assert got == [0, 0, 1, 1]
    warned = [r.getMessage() for r in caplog.records if "were skipped" in r.getMessage()]
    assert len(warned) == 2
    for epoch, message in enumerate(warned):
        assert message.startswith(f"epoch {epoch}: 4 of 6 samples (67%) were skipped; first reasons: sample ")


def test_native_size_mismatch_skipped_and_counted(videos, tmp_path):
    paths, _ = videos
    other = write_video(tmp_path / "other.mp4", 3, frames=20, size=(64, 80))
    clips = shmloader.VideoClips([paths[0], other, paths[1]], clip_len=4)
    with shmloader.Loader(clips, batch_size=2, workers=1, on_error="skip") as loader:
        got = sorted(int(i) for b in loader for i in b["index"])
        assert loader.stats()["skipped"] == 1
    assert got == [0, 2]
    (_, sample, reason), = loader.skipped
    assert sample == 1 and "64x80 but the loader's clips are 96x128" in reason


def test_native_size_mismatch_names_file(videos, tmp_path):
    paths, _ = videos
    other = write_video(tmp_path / "other.mp4", 3, frames=20, size=(64, 80))
    clips = shmloader.VideoClips([paths[0], other], clip_len=4)
    assert clips.decode_size == (96, 128)
    with shmloader.Loader(clips, batch_size=2, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match="64x80 but the loader's clips are 96x128") as info:
            list(loader)
    assert other in str(info.value)


def test_native_size_of_unreadable_first_file(tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"nope")
    with pytest.raises(ValueError, match="bad.mp4"):
        shmloader.VideoClips([str(bad)], clip_len=4)


def test_over_reported_file_loads_the_frames_it_holds(tmp_path):
    """The index lists 40 frames, the cut file holds fewer: the probe names it truncated, PyAV
    reads it (decord would trust the index), and every clip inside what remains is exact."""
    from shmloader.video.probe import probe
    from shmloader.samples import read_codes

    path = tmp_path / "over_reported.mp4"
    over_reported(path)
    info = probe(str(path))
    n = info.frames
    assert 4 <= n < 40 and info.problem == f"truncated at frame {n} of 40" and info.decoder == "pyav"
    clips = shmloader.VideoClips([str(path)], clip_len=4, clips_per_video=n - 3, sampling="uniform", size=(96, 128))
    with shmloader.Loader(clips, batch_size=n - 3, workers=1, timeout=30) as loader:
        (b,) = list(loader)
        stats = loader.stats()
    assert sorted(int(s) for s in b["start"]) == list(range(n - 3))
    ids, numbers = read_codes(b["video"])
    assert (ids == 9).all()
    np.testing.assert_array_equal(numbers, b["frames"])
    assert stats.get("pyav") and not stats.get("decord") and not stats.get("decoder_fallbacks")


def test_one_path_as_a_string_is_refused_in_words(videos):
    """A str is iterable: read as paths it would be one path per character."""
    paths, _ = videos
    with pytest.raises(TypeError, match=r"paths must be a list of paths, got one str: VideoClips\(\["):
        shmloader.VideoClips(paths[0], clip_len=4)
    with pytest.raises(TypeError, match="got one PosixPath"):
        shmloader.VideoClips(__import__("pathlib").Path(paths[0]), clip_len=4)


def test_from_folder_without_class_folders_says_what_it_found(tmp_path):
    from shmloader.samples import make_videos

    make_videos(tmp_path, count=2, frames=8)
    with pytest.raises(ValueError, match="holds 2 videos but no class sub-folders") as info:
        shmloader.VideoClips.from_folder(tmp_path)
    assert "VideoClips(paths)" in str(info.value)
    with pytest.raises(ValueError, match="is not a folder"):
        shmloader.VideoClips.from_folder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no videos"):
        shmloader.VideoClips.from_folder(tmp_path / "empty")


def fails_on_odd(i, rng):
    if i % 2:
        raise ValueError(f"odd sample {i}")
    return {"x": np.full(2, i, np.int64)}


def test_skipped_slices_like_a_list():
    source = shmloader.FunctionSource(fails_on_odd, {"x": ((2,), np.int64)}, 8)
    with shmloader.Loader(source, batch_size=2, workers=1,
                          on_error="skip") as loader:
        list(loader)
        recent = loader.skipped[:2]
        assert isinstance(recent, list) and len(recent) == 2
        assert recent == list(loader.skipped)[:2] and loader.skipped[-1] == list(loader.skipped)[-1]
        assert all(reason for _, _, reason in recent) and {s % 2 for _, s, _ in loader.skipped} == {1}
