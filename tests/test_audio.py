"""Audio beside video (``VideoClips(audio_rate=...)``): every clip with the sound of the instants
its frames show, resampled and mixed as FFmpeg does, checked against a decode of the whole track.

The test videos carry a 441 Hz tone whose amplitude changes at every video frame (frame ``i``:
``_level(i)``), so that audio placed one frame off shows in the levels, and audio half a sample
off shows against the reference decode."""

from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np
import pytest

import shmloader
from shmloader.video.samples import frame_image, make_videos, read_codes

from ._needs import need

pytestmark = pytest.mark.timeout(180)

FPS = 25
FRAMES = 50
RATE = 16000  # what the loader delivers
_TONE = 441.0


def _level(i: np.ndarray | int) -> np.ndarray:
    """Frame ``i``'s amplitude: consecutive frames differ by at least 0.1 (a ratio of 1.2 or more)."""
    return 0.05 + 0.05 * ((7 * np.asarray(i)) % 11)


def _signal(t: np.ndarray, channels: int) -> np.ndarray:
    """``[channels, n]`` samples at times ``t``: the tone at the level of the frame on screen;
    the right channel at half the left's amplitude."""
    x = _level(np.floor(t * FPS + 1e-9).astype(np.int64)) * np.sin(2 * np.pi * _TONE * t)
    return np.stack([x, 0.5 * x][:channels]).astype(np.float32)


_FORMATS = {"aac": "fltp", "libmp3lame": "fltp", "libopus": "flt", "pcm_s16le": "s16"}


def write_av(path, codec: str = "aac", rate: int = 44100, channels: int = 2, frames: int = FRAMES,
             audio_from: float = 0.0, audio_to: float | None = None) -> str:
    """H.264 frames 0..frames-1 (frame codes of video 1) and ``codec`` audio from ``audio_from``
    to ``audio_to`` seconds (the video's end), written with PyAV."""
    path = os.fspath(path)
    end = frames / FPS if audio_to is None else audio_to
    fmt = _FORMATS[codec]
    with av.open(path, "w") as c:
        v = c.add_stream("libx264", rate=FPS)
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        v.options = {"crf": "18", "preset": "veryfast"}
        a = c.add_stream(codec, rate=rate)
        a.layout = "stereo" if channels == 2 else "mono"
        if codec == "aac":  # noise substitution: random noise in any decoder, other after a seek
            a.options = {"aac_pns": "0"}
        first, total, chunk = round(audio_from * rate), round((end - audio_from) * rate), 1000
        done, shown = 0, 0
        while done < total or shown < frames:
            if done < total:
                m = min(chunk, total - done)
                x = _signal((first + done + np.arange(m)) / rate, channels)
                arr = x if fmt == "fltp" else x.T.reshape(1, -1)
                if fmt == "s16":
                    arr = (arr * 32767).astype(np.int16)
                f = av.AudioFrame.from_ndarray(np.ascontiguousarray(arr), format=fmt, layout=a.layout.name)
                f.sample_rate, f.time_base, f.pts = rate, Fraction(1, rate), first + done
                for p in a.encode(f):
                    c.mux(p)
                done += m
            reached = (first + done) / rate if done < total else float("inf")
            while shown < frames and shown / FPS <= reached:
                img = av.VideoFrame.from_ndarray(frame_image(1, shown, 48, 64), format="rgb24")
                for p in v.encode(img):
                    c.mux(p)
                shown += 1
        for p in a.encode():
            c.mux(p)
        for p in v.encode():
            c.mux(p)
    return path


def _convert(frames: list, rate: int, channels: int) -> np.ndarray:
    """``frames`` as one stretch through libswresample (``aresample=osr=R:rematrix_maxval=1``, as
    ``ffmpeg -ar R -ac C`` into 16-bit PCM mixes), ``[n, C]`` float."""
    first = frames[0]
    g = av.filter.Graph()
    chain = [g.add("abuffer", sample_rate=str(first.sample_rate), sample_fmt=first.format.name,
                   channel_layout=first.layout.name, time_base=f"1/{first.sample_rate}"),
             g.add("aresample", osr=str(rate), rematrix_maxval="1"),
             g.add("aformat", sample_fmts="fltp", sample_rates=str(rate),
                   channel_layouts="mono" if channels == 1 else "stereo"),
             g.add("abuffersink")]
    for a, b in zip(chain, chain[1:]):
        a.link_to(b)
    g.configure()
    out = []
    for f in [*frames, None]:
        if f is not None:
            f.pts = None
        g.push(f)
        while True:
            try:
                out.append(g.pull().to_ndarray())
            except (av.error.BlockingIOError, av.error.EOFError, EOFError):
                break
    return np.concatenate(out, axis=1).T


def reference(path, rate: int = RATE, channels: int = 1) -> tuple[float, np.ndarray]:
    """(time of its first sample, ``[n, C]`` samples): the whole audio track decoded by PyAV from
    its start and converted in one go."""
    with av.open(os.fspath(path)) as c:
        s = c.streams.audio[0]
        frames = list(c.decode(s))
        t0 = float(frames[0].pts * s.time_base)
    return t0, _convert(frames, rate, channels)


def expected(ref: tuple[float, np.ndarray], start: float, n: int, rate: int = RATE) -> np.ndarray:
    """The reference's ``n`` samples from ``start`` seconds, zeros where it has none."""
    t_ref, samples = ref
    at = round((start - t_ref) * rate)
    out = np.zeros((n, samples.shape[1]), np.float32)
    lo, hi = max(at, 0), min(at + n, len(samples))
    if lo < hi:
        out[lo - at : hi - at] = samples[lo:hi]
    return out


def best_lag(got: np.ndarray, want_at, n: int, slack: int) -> tuple[int, float]:
    """The shift (samples) within ``slack`` that makes ``got`` closest to the reference, and the
    largest difference there."""
    tries = [(lag, float(np.abs(got[:n] - want_at(lag)).max())) for lag in range(-slack, slack + 1)]
    return min(tries, key=lambda t: t[1])


def frame_levels(audio: np.ndarray, frames: np.ndarray, first: int, rate: int = RATE) -> np.ndarray:
    """RMS of the first channel over each frame of ``frames`` (video frame numbers), 2 ms from
    its edges, the clip's audio starting at frame ``first``."""
    out = []
    for f in frames:
        lo = round((f - first) / FPS * rate + 0.002 * rate)
        hi = round((f - first + 1) / FPS * rate - 0.002 * rate)
        out.append(np.sqrt(np.mean(audio[lo:hi, 0] ** 2)))
    return np.array(out)


def assert_levels_follow_frames(audio: np.ndarray, frames: np.ndarray, first: int) -> None:
    """The tone's level over each frame is that frame's (to a common gain: the mix): a clip's
    audio one frame early or late fails."""
    ratio = frame_levels(audio, frames, first) / _level(frames)
    # Lossy codecs move a frame's level by up to ~8 %; neighbouring frames differ by 30 % or more.
    assert np.abs(ratio / np.median(ratio) - 1).max() < 0.15, ratio


_SHAPES = [("aac", "mp4"), ("pcm_s16le", "mov"), ("pcm_s16le", "mkv"), ("libopus", "mkv"),
           ("libmp3lame", "mp4"), ("aac", "ts"), ("libmp3lame", "ts"), ("pcm_s16le", "avi")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("audio")
    return {(codec, ext): write_av(folder / f"{codec}.{ext}", codec, 48000 if codec == "libopus" else 44100)
            for codec, ext in _SHAPES}


# Samples a clip's audio may lie off the whole-track decode: none where the audio's clock is as
# fine as its samples (MP4 and MOV: the sample rate; MPEG-TS: 90 kHz; AVI: sample counts); Matroska
# stamps packets to the millisecond (half of it: 8 samples at 16 kHz), and a fraction of a sample
# off leaves up to ~0.1 of difference on this tone.
_SLACK = {"mp4": 0, "mov": 0, "ts": 0, "avi": 0, "mkv": 9}
_ATOL = {"mp4": 0.02, "mov": 0.02, "ts": 0.02, "avi": 0.02, "mkv": 0.1}


def video_start(path) -> float:
    """Seconds the video stream starts at (MPEG-TS muxers start later than 0)."""
    with av.open(os.fspath(path)) as c:
        s = c.streams.video[0]
        return 0.0 if s.start_time is None else float(s.start_time * s.time_base)


@pytest.mark.parametrize("codec,ext", _SHAPES)
def test_clip_audio_is_the_whole_track_sliced_at_the_first_frame(files, codec, ext):
    """PCM, AAC, MP3 and Opus in MP4, MOV, MKV, MPEG-TS and AVI (whose video starts later than
    0 in MPEG-TS, and whose audio carries the encoder's priming there, as no edit list drops it)."""
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
        if ext != "mkv":
            assert lag == 0
        assert_levels_follow_frames(audio, np.arange(frames[0], frames[-1] + 1), frames[0])
        if codec == "pcm_s16le" and ext == "mov":  # lossless, to the sample: the tone as written,
            # the two channels mixed to their mean
            times = t0 + np.arange(n) / RATE
            inside = np.abs((times * FPS + 0.5) % 1 - 0.5) > 0.05  # 2 ms from a frame's edges
            written = 0.75 * _signal(times, 1)[0]
            np.testing.assert_allclose(audio[:n, 0][inside], written[inside], atol=0.005)


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
    (dict(audio_rate=16000, sampling="segments", clip_len=4), "segments"),
    (dict(audio_rate=16000, fps=5.0, max_frames=8), "max_frames"),
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
    assert (copy.audio_rate, copy.audio_channels, copy.audio_samples) == (RATE, 2, round(8 / FPS * RATE))
    assert "audio" not in clips.with_options(audio_rate=None).spec()
    timed = clips.with_options(audio_seconds=0.5)
    assert timed.audio_samples == 8000 and timed.with_options(clip_len=2).audio_samples == 8000
    assert "audio" not in timed.with_options(audio_rate=None).spec()


def test_torch_batches_carry_the_audio(files):
    torch = need("torch")

    clips = shmloader.VideoClips([files[("pcm_s16le", "mov")]], clip_len=4, clips_per_video=2, audio_rate=RATE)
    with shmloader.Loader(clips, batch_size=2, workers=1, timeout=60) as loader:
        batch = next(iter(loader.as_torch()))
        assert batch["audio"].dtype == torch.float32 and tuple(batch["audio"].shape) == (2, 2560, 1)
        assert batch["audio_len"].tolist() == [2560, 2560]
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
    """Over HTTP by byte range (the clip's bytes prefetched for its frames, the audio's read as
    the demuxer asks): the same samples as from the local file."""
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
