"""Audio with a gap in its timestamps (a packet stamped later than the samples before it end,
as Matroska and MPEG-TS can store): the gap is silence inside ``audio_len``, and the sound after
it is placed at its own time, not run on from the samples before (NOTE [ Where a clip's audio
lies ])."""

from __future__ import annotations

import numpy as np
import pytest

import shmloader

from ._sound import FPS, RATE, assert_levels_follow_frames, best_lag, write_av

pytestmark = pytest.mark.timeout(120)

GAP = (0.6, 1.0)  # seconds: frames 15 to 24 have no sound


@pytest.mark.parametrize("codec,ext", [("pcm_s16le", "mkv"), ("aac", "mkv"), ("aac", "ts"), ("libmp3lame", "mkv")])
def test_a_gap_is_silence_and_the_sound_after_it_keeps_its_time(tmp_path, codec, ext):
    path = write_av(tmp_path / f"gap.{ext}", codec, gap=GAP)
    clips = shmloader.VideoClips([path], clip_len=30, clips_per_video=1, sampling="uniform", audio_rate=RATE)
    got = clips.reader().read([0])
    frames, audio, length = got["frames"][0], got["audio"][0], int(got["audio_len"][0])
    assert list(frames) == list(range(10, 40))  # uniform: the middle of 50 frames
    assert length == round(30 / FPS * RATE)  # the gap is inside the clip's audio, not cut from it
    at = (frames[0] / FPS)  # the clip's audio starts at its first frame

    def part(t0: float, t1: float) -> np.ndarray:
        return audio[round((t0 - at) * RATE) : round((t1 - at) * RATE), 0]

    # 40 ms from the gap's edges: a lossy codec's last and first packets there blend both sides.
    assert np.abs(part(GAP[0] + 0.04, GAP[1] - 0.04)).max() < 1e-3
    assert np.abs(part(at, GAP[0] - 0.04)).max() > 0.02 and np.abs(part(GAP[1] + 0.04, 1.6)).max() > 0.02
    # Each frame's level is its own on both sides: sound run on from before the gap would put
    # frame 15's level at frame 25.
    sounding = np.r_[10:14, 26:40]
    assert_levels_follow_frames(audio, sounding, int(frames[0]))


@pytest.mark.parametrize("codec,ext", [("aac", "ts"), ("aac", "mkv"), ("pcm_s16le", "mkv")])
def test_clips_on_either_side_of_a_gap_read_together_get_what_they_get_alone(tmp_path, codec, ext):
    """Clips before, across and after the gap, decoded in one window, against each read alone:
    the same samples, to Matroska's half millisecond (its packets are stamped to the
    millisecond, and a stretch read from a later seek is timed by other packets)."""
    path = write_av(tmp_path / f"gap.{ext}", codec, gap=GAP)
    clips = shmloader.VideoClips([path], clip_len=8, frame_step=1, clips_per_video=5, sampling="uniform",
                                 audio_rate=RATE)
    together = clips.reader().read(range(5))
    n = round(8 / FPS * RATE)
    for i in range(5):
        alone = clips.reader().read([i])
        assert list(alone["frames"][0]) == list(together["frames"][i])
        assert int(alone["audio_len"][0]) == int(together["audio_len"][i]) == n
        a, b = alone["audio"][0][:, 0], together["audio"][i][:, 0]
        slack = 8 if ext == "mkv" else 0
        lag, diff = best_lag(a[slack : n - slack, None], lambda k: b[slack + k : n - slack + k, None],
                             n - 2 * slack, slack)
        assert diff < (0.1 if ext == "mkv" else 0.02), (i, lag, diff)  # as test_audio.py's _ATOL
