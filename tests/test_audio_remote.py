"""Audio of files read where they live (``VideoClips(audio_rate=...)``): members of WebDataset tar
shards, local and over HTTP, give the samples of the same files loose; a remote MP4's clip has
its audio's bytes fetched with its frames' (NOTE [ Reading remote files ]), so that reading it
asks for nothing more.

Servers are the ones of tests/_servers.py: bound to 127.0.0.1, started and stopped here, each
with a bound on the requests it answers."""

from __future__ import annotations

import os
import tarfile

import numpy as np
import pytest

import shmloader

from ._needs import need
from ._servers import RangeServer
from ._sound import FPS, RATE, write_av

pytestmark = pytest.mark.timeout(180)

# (codec, extension) of the files in the shard: AAC in MP4 (an edit list drops its priming), PCM
# in MOV, Opus in Matroska (millisecond stamps, pre-skip), MP3 in MPEG-TS (byte-based seeking).
_SHAPES = [("aac", "mp4"), ("pcm_s16le", "mov"), ("libopus", "mkv"), ("libmp3lame", "ts")]
_RATES = {"libopus": 48000}
_CLIPS = dict(clip_len=4, frame_step=3, clips_per_video=3, clips_per_sample=2, sampling="uniform")


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """The loose files with sound, and a tar shard ``shard.tar`` of them (``keyN.ext`` beside
    ``keyN.cls``) in a folder of its own: what is read from the shard is read from it alone."""
    root = tmp_path_factory.mktemp("audio-shard")
    loose = [write_av(root / f"key{i}.{ext}", codec, _RATES.get(codec, 44100), frames=40)
             for i, (codec, ext) in enumerate(_SHAPES)]
    (root / "served").mkdir()
    with tarfile.open(root / "served" / "shard.tar", "w") as t:
        for i, path in enumerate(loose):
            t.add(path, arcname=os.path.basename(path))
            label = root / f"key{i}.cls"
            label.write_text(str(i))
            t.add(label, arcname=label.name)
    return loose, root / "served"


def _same_samples(got: dict, want: dict) -> None:
    """``got`` holds ``want``'s clips, frames and sound, sample for sample."""
    np.testing.assert_array_equal(got["frames"], want["frames"])
    np.testing.assert_array_equal(got["video"], want["video"])
    np.testing.assert_array_equal(got["audio_len"], want["audio_len"])
    np.testing.assert_array_equal(got["audio"], want["audio"])
    assert (want["audio_len"] > 0).all() and np.abs(want["audio"]).max() > 0.02  # sound, not zeros


def test_a_local_shards_members_have_the_loose_files_audio(shard):
    """Members of a local tar shard (read by byte range from inside it) against the same files
    loose: the same clips and the same audio to the bit, two clips a sample, in each shape."""
    loose, served = shard
    clips = shmloader.VideoClips.from_shards(os.fspath(served / "shard.tar"), audio_rate=RATE,
                                             audio_channels=2, **_CLIPS)
    assert [p.split("::")[0] for p in clips.paths] == [f"tar://{os.path.basename(p)}" for p in loose]
    assert list(clips.labels) == list(range(len(loose)))
    n = len(clips)
    got = clips.reader().read(range(n))
    want = shmloader.VideoClips(loose, decoder="pyav", audio_rate=RATE, audio_channels=2,
                                **_CLIPS).reader().read(range(n))
    assert got["audio"].shape == (n, 2, round(10 / FPS * RATE), 2)
    _same_samples(got, want)


def test_a_remote_shards_members_have_the_loose_files_audio_through_workers(shard):
    """The shard over HTTP, read by two loader workers (the members' places handed to them by
    ``from_shards``): batch for batch what a loader of the loose files delivers, the audio to
    the bit (a batch's clips of one video are decoded together in either)."""
    need("aiohttp", reason="the http filesystem of fsspec")
    loose, served = shard

    def batches(clips) -> list[dict]:
        with shmloader.Loader(clips, batch_size=3, workers=2, seed=4, shuffle=True, timeout=60) as loader:
            return [{k: np.array(v) for k, v in b.items()} for b in loader]

    want = batches(shmloader.VideoClips(loose, decoder="pyav", audio_rate=RATE, **_CLIPS))
    with RangeServer(os.fspath(served), max_requests=2000) as srv:
        got = batches(shmloader.VideoClips.from_shards(srv.url("shard.tar"), audio_rate=RATE, **_CLIPS))
        assert srv.gets > 0
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["index"], w["index"])
        _same_samples(g, w)
