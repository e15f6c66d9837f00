"""Audio beside video (``VideoClips(audio_rate=...)``): every clip with the sound of the instants
its frames show, resampled and mixed as FFmpeg does, checked against a decode of the whole track.

The test videos (``tests/_sound.py``) carry a 441 Hz tone whose amplitude changes at every video
frame, so that audio placed one frame off shows in the levels, and audio half a sample off shows
against the reference decode."""

from __future__ import annotations

import os
import subprocess

import av
import numpy as np
import pytest

import shmloader
from shmloader.video.samples import make_videos, read_codes

from ._needs import need, need_av
from ._sound import (FPS, RATE, _level, _signal, assert_levels_follow_frames, best_lag, expected, reference,
                     video_start, write_av)

pytestmark = pytest.mark.timeout(180)

_SHAPES = [("aac", "mp4"), ("pcm_s16le", "mov"), ("pcm_s16le", "mkv"), ("libopus", "mkv"),
           ("libmp3lame", "mp4"), ("aac", "ts"), ("libmp3lame", "ts"), ("pcm_s16le", "avi"),
           ("libopus", "webm"), ("vorbis", "webm"), ("vorbis", "mkv"), ("libmp3lame", "avi"), ("aac", "mov"),
           ("aac", "mkv"), ("libopus", "mp4")]
_RATES = {"libopus": 48000, "vorbis": 48000}
# LAME's encoder delay, in samples, as FFmpeg's libmp3lame encoder gives it (its initial padding).
_MP3_DELAY = 1105


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("audio")
    return {(codec, ext): write_av(folder / f"{codec}.{ext}", codec, _RATES.get(codec, 44100))
            for codec, ext in _SHAPES}


# Samples a clip's audio may lie off the whole-track decode: none where the audio's clock is as
# fine as its samples (MP4 and MOV: the sample rate; MPEG-TS: 90 kHz; AVI: sample counts); Matroska
# (and WebM) stamps packets to the millisecond (half of it: 8 samples at 16 kHz), and a fraction of
# a sample off leaves up to ~0.1 of difference on this tone.
_SLACK = {"mp4": 0, "mov": 0, "ts": 0, "avi": 0, "mkv": 9, "webm": 9}
_ATOL = {"mp4": 0.02, "mov": 0.02, "ts": 0.02, "avi": 0.02, "mkv": 0.1, "webm": 0.1}


@pytest.mark.parametrize("codec,ext", _SHAPES)
def test_clip_audio_is_the_whole_track_sliced_at_the_first_frame(files, codec, ext):
    """PCM, AAC, MP3, Opus and Vorbis in MP4, MOV, MKV, WebM (VP9 frames), MPEG-TS and AVI (whose
    video starts later than 0 in MPEG-TS, and whose audio carries the encoder's priming there, as
    no edit list drops it)."""
    path = files[(codec, ext)]
    clips = shmloader.VideoClips([path], clip_len=4, frame_step=3, clips_per_video=14, sampling="uniform",
                                 audio_rate=RATE)
    span = (3 * 3 + 1) / FPS  # (clip_len - 1) * frame_step + 1 frames
    assert clips.spec()["audio"] == ((round(span * RATE), 1), np.dtype(np.float32))
    got = clips.reader().read(range(14))  # a clip every 3 frames: one window decoded for all
    ref = reference(path)
    n = round(span * RATE)
    for audio, length, frames, video in zip(got["audio"], got["audio_len"], got["frames"], got["video"]):
        assert list(read_codes(video)[1]) == list(frames)
        assert abs(length - n) <= _SLACK[ext]  # inside the track (its end as stamped, in Matroska)
        t0 = frames[0] / FPS + video_start(path)
        lag, diff = best_lag(audio, lambda k: expected(ref, t0 + k / RATE, n), n, _SLACK[ext])
        assert diff < _ATOL[ext], (frames, lag, diff)
        if ext not in ("mkv", "webm"):
            assert lag == 0
        if (codec, ext) == ("libmp3lame", "avi"):
            # AVI has no timestamps to take MP3's encoder delay off by (MP4's edit list and
            # MPEG-TS's stamps do): the file's sound is that much late, as FFmpeg plays it.
            late = round(_MP3_DELAY / 44100 * RATE)
            assert_levels_follow_frames(audio[late:], np.arange(frames[0], frames[-1]), frames[0])
        else:
            assert_levels_follow_frames(audio, np.arange(frames[0], frames[-1] + 1), frames[0])
        if codec == "pcm_s16le" and ext == "mov":  # lossless, to the sample: the tone as written,
            # the two channels mixed to their mean
            times = t0 + np.arange(n) / RATE
            inside = np.abs((times * FPS + 0.5) % 1 - 0.5) > 0.05  # 2 ms from a frame's edges
            written = 0.75 * _signal(times, 1)[0]
            np.testing.assert_allclose(audio[:n, 0][inside], written[inside], atol=0.005)


@pytest.mark.parametrize("codec,ext", _SHAPES)
def test_the_whole_track_reference_is_ffmpegs_own_decode(files, codec, ext):
    """The reference the clips are checked against is what ``ffmpeg -i F -ar 16000 -ac 1`` gives
    (the FFmpeg command line of imageio-ffmpeg's build, into 16-bit PCM): the same samples from
    the track's first, up to the 16-bit rounding. FFmpeg 9 (imageio-ffmpeg 0.8.1): the 7.0 of
    0.6.0 crashes on these MPEG-TS files and keeps AAC's priming in Matroska."""
    ffmpeg = need("imageio_ffmpeg").get_ffmpeg_exe()
    if (codec, ext) == ("aac", "mkv"):  # FFmpeg 7.1 (av 15) keeps them: its samples come 1024 late
        need_av(av.library_versions["libavformat"] >= (62,), "AAC's priming samples dropped in Matroska "
                "(FFmpeg 8's demuxer)")
    path = files[(codec, ext)]
    out = subprocess.run([ffmpeg, "-v", "error", "-i", path, "-vn", "-ar", str(RATE), "-ac", "1", "-f", "s16le", "-"],
                         capture_output=True, check=True, timeout=60).stdout
    theirs = np.frombuffer(out, np.int16) / 32768
    ours = reference(path)[1][:, 0]
    # FFmpeg's command line ends the track where an MP4 edit list says (our reference decodes
    # the encoder's padding after it too; no clip reaches past the video's end).
    assert len(theirs) > 0.9 * len(ours)
    n = min(len(theirs), len(ours))
    # Two FFmpeg versions' MP3 and AAC decoders differ in a few samples by under 0.001; one
    # sample off on this tone differs by up to 0.07.
    np.testing.assert_allclose(theirs[:n], ours[:n], atol=2e-3)


def test_loader_workers_deliver_the_readers_audio_stereo_and_several_clips(files):
    """Through ``Loader`` with two workers, frames by decord (audio still by PyAV), two clips per
    sample, stereo: what ``reader().read`` gives, the right channel half the left."""
    paths = [files[("aac", "mp4")], files[("pcm_s16le", "mov")]]
    clips = shmloader.VideoClips(paths, [0, 1], clip_len=5, frame_step=2, clips_per_video=3,
                                 clips_per_sample=2, audio_rate=22050, audio_channels=2, decoder="decord")
    n = round((4 * 2 + 1) / FPS * 22050)
    assert clips.spec()["audio"] == ((2, n, 2), np.dtype(np.float32))
    assert clips.spec()["audio_len"] == ((2,), np.dtype(np.int32))
    with shmloader.Loader(clips, batch_size=4, workers=2, seed=3, shuffle=True, timeout=60) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
        assert loader.stats()["decord"] > 0
    rows = [(b, j) for b in batches for j in range(len(b["index"]))]
    assert len(rows) == len(clips)
    refs = [reference(p, 22050, 2) for p in paths]
    for b, j in rows:
        for k in range(2):
            audio, frames = b["audio"][j, k], b["frames"][j, k]
            assert b["audio_len"][j, k] == n
            want = expected(refs[b["index"][j]], frames[0] / FPS, n, 22050)
            np.testing.assert_allclose(audio[:n], want, atol=0.02)
            if b["index"][j] == 1:  # PCM: the channels as written (AAC codes them jointly)
                np.testing.assert_allclose(audio[:n, 1], 0.5 * audio[:n, 0], atol=0.01)


def test_grouped_decode_gives_each_clip_the_readers_audio(files):
    """``group_clips``: a worker decodes a video's samples in one pass; each keeps its own audio."""
    paths = [files[("pcm_s16le", "mkv")], files[("libopus", "mkv")]]
    clips = shmloader.VideoClips(paths, clip_len=3, frame_step=4, clips_per_video=4, audio_rate=RATE,
                                 group_clips=True)
    with shmloader.Loader(clips, batch_size=2, workers=2, seed=5, timeout=60) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
    got = np.concatenate([b["audio"] for b in batches])
    ids = [int(i) for b in batches for i in b["index"]]
    starts = [int(s) for b in batches for s in b["start"]]
    again = clips.reader().read(range(len(clips)), seed=5)
    mine = {(int(i), int(s)): a for i, s, a in zip(again["index"], again["start"], again["audio"])}
    for i, s, a in zip(ids, starts, got):
        np.testing.assert_array_equal(a, mine[(i, s)])


def test_the_ring_holds_each_samples_audio_and_delivers_views_of_it(files):
    """The slots are laid out from ``spec()``, audio included: a batch's ``audio`` and
    ``audio_len`` are views into its slot, not copies, and hold the reader's samples."""
    clips = shmloader.VideoClips([files[("pcm_s16le", "mov")]], clip_len=4, clips_per_video=4,
                                 clips_per_sample=2, sampling="uniform", audio_rate=RATE, audio_channels=2)
    n = round(4 / FPS * RATE)
    spec = clips.spec()
    assert spec["audio"] == ((2, n, 2), np.dtype(np.float32)) and spec["audio_len"] == ((2,), np.dtype(np.int32))
    with shmloader.Loader(clips, batch_size=3, workers=1, timeout=60) as loader:
        assert loader.element_spec["audio"] == ((None, 2, n, 2), np.dtype(np.float32))
        fields = {f.name: f for f in loader._ring.layout.fields}
        assert fields["audio"].nbytes == 3 * 2 * n * 2 * 4 and fields["audio_len"].nbytes == 3 * 2 * 4
        assert loader._ring.layout.slot_bytes >= sum(f.nbytes for f in fields.values())
        batch = next(iter(loader))
        for name in ("audio", "audio_len", "video"):
            assert loader._ring.contains(batch[name].ctypes.data), name
        alone = clips.reader().read(range(3))  # in order: no shuffle
        np.testing.assert_array_equal(batch["start"], alone["start"])
        np.testing.assert_array_equal(batch["audio_len"], alone["audio_len"])
        np.testing.assert_allclose(batch["audio"], alone["audio"], atol=1e-4)
        assert (batch["audio_len"] == n).all() and np.abs(batch["audio"]).max() > 0.02
        del batch


def test_a_resumed_loader_delivers_the_audio_of_an_uninterrupted_run(tmp_path):
    """``state()`` mid-epoch, a new loader from it: the batches left, random clips and their
    sound included, are those the whole run delivered."""
    paths = [write_av(tmp_path / "a.mp4", "aac"), write_av(tmp_path / "b.mkv", "pcm_s16le")]
    clips = shmloader.VideoClips(paths, [0, 1], clip_len=4, frame_step=2, clips_per_video=3, audio_rate=RATE)
    settings = dict(batch_size=2, workers=2, shuffle=True, seed=4, epochs=2, timeout=60)

    def fields(batch):
        return {k: np.array(batch[k]) for k in ("index", "start", "audio", "audio_len")}

    with shmloader.Loader(clips, **settings) as loader:
        whole = [fields(b) for b in loader]
    assert len(whole) == 6
    with shmloader.Loader(clips, **settings) as loader:
        it = iter(loader)
        first = [fields(next(it)) for _ in range(2)]  # 2 of the first epoch's 3 batches
        state = loader.state()
    with shmloader.Loader(clips, **settings, state=state) as loader:
        rest = [fields(b) for b in loader]
    assert len(first) + len(rest) == len(whole)
    for got, want in zip(first + rest, whole):
        for k in ("index", "start", "audio_len"):
            np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_allclose(got["audio"], want["audio"], atol=1e-4)
    assert all(np.abs(b["audio"]).max() > 0.02 for b in rest)
    starts = [tuple(b["start"]) for b in whole]
    assert starts[:3] != starts[3:]  # random starts: each epoch its own clips, and their sound


def test_a_file_without_audio_gives_zeros_and_length_0(tmp_path):
    (path,), _ = make_videos(tmp_path, count=1, frames=30, size=(48, 64))
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=2, audio_rate=RATE)
    got = clips.reader().read([0, 1])
    assert got["audio"].shape == (2, round(4 / FPS * RATE), 1)
    assert not got["audio"].any() and list(got["audio_len"]) == [0, 0]


@pytest.mark.parametrize("ext", ["mp4", "mkv"])
def test_audio_that_starts_after_the_video_is_silence_then_sound(tmp_path, ext):
    path = write_av(tmp_path / f"late.{ext}", "pcm_s16le" if ext == "mkv" else "aac", audio_from=0.4)
    clips = shmloader.VideoClips([path], clip_len=20, clips_per_video=1, sampling="uniform", audio_rate=RATE)
    got = clips.reader().read([0])
    frames = got["frames"][0]
    assert frames[0] == 15  # uniform: the middle of 50 frames
    early = clips.with_options(sampling="random")
    reader = early.reader()
    for seed in range(40):  # a clip that starts at frame 0
        first = reader.read([0], seed=seed)
        if first["frames"][0][0] < 6:
            break
    else:
        pytest.fail("no clip drawn before the audio starts")
    f0 = int(first["frames"][0][0])
    n = round(20 / FPS * RATE)
    audio, length = first["audio"][0], int(first["audio_len"][0])
    assert length == n  # the silence before the track is part of the clip
    ref = reference(path)
    # MP4: the track starts with the encoder's priming, which FFmpeg keeps here (an empty edit
    # before the track's edit): 1024 samples before 0.4 s.
    assert ref[0] == pytest.approx(0.4, abs=0.03)
    quiet = round((ref[0] - f0 / FPS) * RATE)
    assert not audio[: quiet - 20].any() and np.abs(audio[quiet + 800 : quiet + 2000]).max() > 0.02
    lag, diff = best_lag(audio, lambda k: expected(ref, f0 / FPS + k / RATE, n), n, _SLACK[ext])
    assert diff < _ATOL[ext], (lag, diff)
    sounding = np.arange(11, f0 + 20)
    assert_levels_follow_frames(audio, sounding, f0)


@pytest.mark.parametrize("codec,ext,decoder", [("aac", "mp4", "decord"), ("aac", "mp4", "pyav"),
                                               ("pcm_s16le", "mkv", "auto")])
def test_audio_that_starts_before_the_video_is_placed_by_the_first_frames_time(tmp_path, codec, ext, decoder):
    """The video's first frame at 0.52 s, the sound from 0 (MP4: an edit list delays the video):
    sample 0 of a clip is the sound at its first frame's time, not at the file's 0, and the
    sound before the first frame belongs to no clip."""
    path = write_av(tmp_path / f"early.{ext}", codec, video_from=0.52)
    lead = 13  # frames of sound before frame 0
    clips = shmloader.VideoClips([path], clip_len=10, clips_per_video=5, sampling="uniform", audio_rate=RATE,
                                 decoder=decoder)
    got = clips.reader().read(range(5))
    assert [int(s) for s in got["start"]] == [0, 10, 20, 30, 40]
    ref = reference(path)
    assert ref[0] == pytest.approx(0.0, abs=1e-3) and video_start(path) == pytest.approx(0.52)
    n = round(10 / FPS * RATE)
    for audio, length, frames, video in zip(got["audio"], got["audio_len"], got["frames"], got["video"]):
        assert list(read_codes(video)[1]) == list(frames)
        assert abs(int(length) - n) <= _SLACK[ext]
        t0 = (lead + frames[0]) / FPS
        lag, diff = best_lag(audio, lambda k: expected(ref, t0 + k / RATE, n), n, _SLACK[ext])
        assert diff < _ATOL[ext], (frames, lag, diff)
        assert ext == "mkv" or lag == 0
        # The tone's level over each frame is the level written for the instant it is shown.
        assert_levels_follow_frames(audio, lead + np.arange(frames[0], frames[-1] + 1), lead + frames[0])


def test_audio_that_ends_before_the_clip_is_cut_there(tmp_path):
    path = write_av(tmp_path / "short.mov", "pcm_s16le", audio_to=1.0)  # 25 frames of 50
    clips = shmloader.VideoClips([path], clip_len=10, clips_per_video=3, sampling="uniform", audio_rate=RATE)
    got = clips.reader().read([0, 1, 2])
    n = round(10 / FPS * RATE)
    starts = [int(s) for s in got["start"]]
    for start, audio, length in zip(starts, got["audio"], got["audio_len"]):
        want = min(n, max(0, round((1.0 - start / FPS) * RATE)))
        assert length == want, (start, length, want)
        assert not audio[length:].any()
        if length:
            assert np.abs(audio[:length]).max() > 0.02
    assert starts[-1] == 40 and got["audio_len"][-1] == 0


def test_a_slower_video_than_the_first_raises_naming_it_or_is_skipped(files, tmp_path):
    """Room for audio is set by the first video's frame rate: a clip of a slower one spans more
    and is refused, naming the file and the ``audio_seconds`` that would hold it."""
    (slow,), _ = make_videos(tmp_path, count=1, frames=30, size=(48, 64), fps=10)
    clips = shmloader.VideoClips([files[("aac", "mp4")], slow], clip_len=8, audio_rate=RATE)
    assert clips.audio_samples == round(8 / FPS * RATE)
    with shmloader.Loader(clips, batch_size=2, workers=1, timeout=60) as loader:
        with pytest.raises(shmloader.SampleError, match=r"10fps\.mp4.*0\.800 s.*audio_seconds=0\.800"):
            next(iter(loader))
    with shmloader.Loader(clips, batch_size=1, workers=1, timeout=60, on_error="skip") as loader:
        assert [int(b["index"][0]) for b in loader] == [0]
        assert len(loader.skipped) == 1
    assert shmloader.VideoClips([files[("aac", "mp4")], slow], clip_len=8, audio_rate=RATE,
                                audio_seconds=0.8).reader().read([1])["audio_len"][0] == 0


def test_fps_clips_have_room_for_their_span(files):
    path = files[("aac", "mp4")]
    clips = shmloader.VideoClips([path], clip_len=4, fps=12.5, clips_per_video=3, sampling="uniform",
                                 audio_rate=RATE)
    assert clips.audio_samples == round(5 / 12.5 * RATE)
    got = clips.reader().read([0, 1, 2])
    ref = reference(path)
    for audio, length, frames in zip(got["audio"], got["audio_len"], got["frames"]):
        assert list(np.diff(frames)) == [2, 2, 2]
        n = round((frames[-1] - frames[0] + 1) / FPS * RATE)
        assert length == n
        np.testing.assert_allclose(audio[:n], expected(ref, frames[0] / FPS, n), atol=0.02)
        assert not audio[n:].any()


@pytest.mark.parametrize("kwargs,message", [
    (dict(audio_rate=0), "audio_rate"),
    (dict(audio_rate=16000.5), "audio_rate"),
    (dict(audio_rate="16k"), "audio_rate"),
    (dict(audio_rate=16000, audio_channels=6), "audio_channels must be 1 .mono. or 2"),
    (dict(audio_rate=16000, audio_channels=True), "audio_channels"),
    (dict(audio_seconds=1.0), "audio_seconds needs audio_rate"),
    (dict(audio_rate=16000, audio_seconds=0), "audio_seconds"),
])
def test_bad_audio_arguments_are_refused_in_words(files, kwargs, message):
    with pytest.raises(ValueError, match=message):
        shmloader.VideoClips([files[("aac", "mp4")]], **kwargs)


@pytest.mark.parametrize("codec,ext", [("aac", "mp4"), ("libopus", "mkv")])
def test_clips_read_together_have_the_audio_of_clips_read_alone(files, codec, ext):
    """Spans less than a second apart are decoded in one window: each clip's audio is the one
    its own seek gives."""
    clips = shmloader.VideoClips([files[(codec, ext)]], clip_len=4, frame_step=2, clips_per_video=3,
                                 clips_per_sample=2, sampling="uniform", audio_rate=RATE)
    reader = clips.reader()
    together = reader.read(range(3))
    for i in range(3):
        alone = clips.reader().read([i])
        np.testing.assert_array_equal(alone["audio_len"][0], together["audio_len"][i])
        np.testing.assert_allclose(alone["audio"][0], together["audio"][i], atol=1e-4)


def test_mono_is_copied_to_both_channels_of_stereo(tmp_path):
    path = write_av(tmp_path / "mono.mov", "pcm_s16le", channels=1)
    clips = shmloader.VideoClips([path], clip_len=5, clips_per_video=2, sampling="uniform", audio_rate=RATE,
                                 audio_channels=2)
    got = clips.reader().read([0, 1])
    for audio, length, start in zip(got["audio"], got["audio_len"], got["start"]):
        times = start / FPS + np.arange(length) / RATE
        inside = np.abs((times * FPS + 0.5) % 1 - 0.5) > 0.05
        np.testing.assert_array_equal(audio[:, 0], audio[:, 1])
        np.testing.assert_allclose(audio[:length, 0][inside], _signal(times, 1)[0][inside], atol=0.005)


def test_audio_survives_with_options_and_options(files):
    clips = shmloader.VideoClips([files[("aac", "mp4")]], clip_len=4, audio_rate=RATE, audio_channels=2)
    copy = clips.with_options(clip_len=8)
    assert (copy.audio, copy.audio_samples) == (shmloader.Audio(rate=RATE, channels=2), round(8 / FPS * RATE))
    assert "audio" not in clips.with_options(audio_rate=None).spec()
    timed = clips.with_options(audio_seconds=0.5)
    assert timed.audio_samples == 8000 and timed.with_options(clip_len=2).audio_samples == 8000
    assert "audio" not in timed.with_options(audio_rate=None).spec()


def test_the_first_video_is_probed_once_for_its_size_and_its_frame_rate(files, monkeypatch):
    """``size=None`` needs the first video's size, audio without ``audio_seconds`` its frame rate:
    one probe serves both, when the description is made and when ``with_options`` makes a copy
    (counted by a spy on the probe, which still reads the file)."""
    from shmloader.clips import arguments

    calls = []
    real = arguments.probe
    monkeypatch.setattr(arguments, "probe", lambda path, **kw: calls.append(path) or real(path, **kw))
    path = files[("aac", "mp4")]
    clips = shmloader.VideoClips([path], clip_len=4, audio_rate=RATE)
    assert (len(calls), clips.decode_size, clips.audio_samples) == (1, (48, 64), round(4 / FPS * RATE))
    copy = clips.with_options(clip_len=8)
    assert (len(calls), copy.audio_samples) == (2, round(8 / FPS * RATE))
    shmloader.VideoClips([path], clip_len=4, size=(32, 32), audio_rate=RATE)  # the frame rate alone
    shmloader.VideoClips([path], clip_len=4, audio_rate=RATE, audio_seconds=0.5)  # the size alone
    shmloader.VideoClips([path], clip_len=4, size=(32, 32), audio_rate=RATE, audio_seconds=0.5)  # neither
    assert calls == [path] * 4


def test_an_unreadable_first_video_is_named_for_the_argument_that_needs_it(tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"nope")
    with pytest.raises(ValueError, match=r"size=None: cannot read the native size of .*bad\.mp4"):
        shmloader.VideoClips([bad], clip_len=4, audio_rate=RATE)
    with pytest.raises(ValueError, match=r"audio_rate: cannot read the frame rate .*audio_seconds=.* of .*bad\.mp4"):
        shmloader.VideoClips([bad], clip_len=4, size=(32, 32), audio_rate=RATE)


def test_a_files_frames_and_sound_are_read_through_one_open_container(files, monkeypatch):
    """Where PyAV decodes the frames, the audio is read through the container the frames came
    from (kept open for the next clip): one open of the file for every clip read from it, sound
    included (counted by a spy on the decoder's open, which still opens the file)."""
    from shmloader.video.pyav import PyAV

    opened = []
    real = PyAV._open_file
    monkeypatch.setattr(PyAV, "_open_file", lambda self, media: opened.append(media.path) or real(self, media))
    path = files[("aac", "mp4")]
    clips = shmloader.VideoClips([path], clip_len=4, frame_step=2, clips_per_video=6, sampling="uniform",
                                 audio_rate=RATE, decoder="pyav")
    reader = clips.reader()
    for ids in ([0], [3], [1, 5]):
        got = reader.read(ids)
        assert (got["audio_len"] > 0).all() and np.abs(got["audio"]).max() > 0.02
    assert opened == [path] and reader.counters()["pyav"] == 3


def test_torch_batches_carry_the_audio(files):
    torch = need("torch")

    clips = shmloader.VideoClips([files[("pcm_s16le", "mov")]], clip_len=4, clips_per_video=2, sampling="uniform",
                                 audio_rate=RATE)
    want = clips.reader().read([0, 1])
    with shmloader.Loader(clips, batch_size=2, workers=1, timeout=60) as loader:
        batch = next(iter(loader.as_torch()))
        assert batch["audio"].dtype == torch.float32 and tuple(batch["audio"].shape) == (2, 2560, 1)
        assert batch["audio_len"].dtype == torch.int32 and batch["audio_len"].tolist() == [2560, 2560]
        np.testing.assert_allclose(batch["audio"].numpy(), want["audio"], atol=1e-4)
        assert float(batch["audio"].abs().max()) > 0.02


def _damage_audio(path: str, start: float, end: float) -> None:
    """Overwrite the audio packets stamped in ``[start, end)`` seconds with noise."""
    with av.open(path) as c:
        s = c.streams.audio[0]
        spots = [(p.pos, p.size) for p in c.demux(s)
                 if p.pts is not None and start <= float(p.pts * s.time_base) < end]
    rng = np.random.default_rng(0)
    with open(path, "r+b") as f:
        for pos, size in spots:
            f.seek(pos)
            f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())


def test_damaged_audio_follows_on_error_naming_the_file_and_time(tmp_path):
    """Packets the AAC decoder refuses, in a clip's span or just before it (whose transform
    overlaps it): the loader's ``on_error``, naming the file and the time; clips whose audio
    is whole are delivered."""
    path = write_av(tmp_path / "damaged.mp4", "aac")
    _damage_audio(path, 0.8, 1.0)
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=10, sampling="uniform", audio_rate=RATE)
    with shmloader.Loader(clips, batch_size=10, workers=1, timeout=60) as loader:
        with pytest.raises(shmloader.SampleError, match=r"damaged\.mp4.*damaged audio at 0\.8\d\d s"):
            next(iter(loader))
    with shmloader.Loader(clips, batch_size=1, workers=2, timeout=60, on_error="skip") as loader:
        starts = sorted(int(b["start"][0]) for b in loader)
        assert len(loader.skipped) == 2
    assert starts == [0, 5, 10, 15, 31, 36, 41, 46]  # 20 (0.8 s) and 25 (1.0 s) lost their sound


def test_the_guides_example_runs(files):
    from ._examples import doc_example

    paths = [files[("aac", "mp4")], files[("pcm_s16le", "mkv")]] * 4
    namespace = {"paths": paths, "labels": list(range(8))}
    exec(doc_example("audio-clips"), namespace)
    n = round(31 / FPS * 16000)
    assert namespace["audio"].shape == (8, n, 1) and namespace["audio"].dtype == np.float32
    assert namespace["audio_len"].shape == (8,) and namespace["video"].shape[:2] == (8, 16)


def test_a_remote_files_audio_is_the_local_files(files):
    """Over HTTP by byte range (the bytes of the clip's frames and of its audio prefetched
    together; tests/test_audio_remote.py has the requests): the same samples as from the local
    file."""
    from ._needs import need
    from ._servers import RangeServer

    need("aiohttp", reason="the http filesystem of fsspec")
    path = files[("aac", "mp4")]
    kw = dict(clip_len=4, frame_step=2, clips_per_video=3, sampling="uniform", audio_rate=RATE)
    local = shmloader.VideoClips([path], **kw).reader().read(range(3))
    with RangeServer(os.path.dirname(path)) as srv:
        remote = shmloader.VideoClips([srv.url(os.path.basename(path))], **kw).reader().read(range(3))
    np.testing.assert_array_equal(remote["audio_len"], local["audio_len"])
    np.testing.assert_array_equal(remote["audio"], local["audio"])
    assert remote["audio"].any()


@pytest.mark.parametrize("short_video", ["repeat_last", "wrap"])
def test_a_clip_longer_than_its_video_spans_the_video(tmp_path, short_video):
    """A clip of a short video repeats frames (or wraps to the start): its audio spans from its
    first frame to the end of its latest, here the whole video, and is zeros after."""
    path = write_av(tmp_path / "short.mov", "pcm_s16le", frames=10)
    clips = shmloader.VideoClips([path], clip_len=16, audio_rate=RATE, short_video=short_video)
    got = clips.reader().read([0])
    frames, audio, length = got["frames"][0], got["audio"][0], int(got["audio_len"][0])
    assert frames[0] == 0 and frames.max() == 9 and len(audio) == round(16 / FPS * RATE)
    assert length == round(10 / FPS * RATE)
    assert np.abs(audio[:length]).max() > 0.02 and not audio[length:].any()
    assert_levels_follow_frames(audio, np.arange(10), 0)
