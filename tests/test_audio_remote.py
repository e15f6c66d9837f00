"""Audio of files read where they live (``VideoClips(audio_rate=...)``): members of WebDataset tar
shards, local and over HTTP, give the samples of the same files loose; a remote MP4's clip has
its audio's bytes fetched with its frames' (NOTE [ Reading remote files ]), so that reading it
asks for nothing more.

Servers are the ones of tests/_servers.py: bound to 127.0.0.1, started and stopped here, each
with a bound on the requests it answers."""

from __future__ import annotations

import os
import tarfile

import av
import numpy as np
import pytest

import shmloader
from shmloader.video.audio import clip_spans
from shmloader.video.audiobytes import audio_ranges
from shmloader.video._av import INDEX_ENTRIES
from shmloader.video.decoding import Decoding
from shmloader.video.pyav import byte_ranges
from shmloader.video.storage import Storage

from ._needs import need, need_av
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


# -- a remote clip's audio bytes, fetched before it is read --------------------------------------

_GOP = 25
_BLOCK = 4096  # small blocks: a byte read that the plan left out shows as a request of its own


@pytest.fixture(scope="module")
def long_av(tmp_path_factory):
    """Twelve seconds of H.264 (a keyframe a second) and AAC, interleaved as muxers write them."""
    need("aiohttp", reason="the http filesystem of fsspec")
    root = tmp_path_factory.mktemp("audio-remote")
    return os.fspath(write_av(root / "long.mp4", "aac", frames=12 * FPS, gop=_GOP))


def _blocks(ranges) -> set[int]:
    return {k for lo, hi in ranges for k in range(lo // _BLOCK, (hi - 1) // _BLOCK + 1)}


def test_a_remote_clips_audio_is_fetched_in_one_request_and_is_the_local_files(long_av):
    """The probe keeps where an MP4's audio packets lie (its index): reading a clip's audio
    fetches them, pre-roll and tail included, in one request before decoding, and asks for
    nothing more; the audio is the local file's to the bit."""
    need_av(INDEX_ENTRIES, "where a remote MP4's audio packets lie, from its index (Stream.index_entries)")
    root, name = os.path.split(long_av)
    local = Decoding(1, "pyav", Storage())
    info_here = local.info(long_av)
    with RangeServer(root, max_requests=500) as srv:
        decoding = Decoding(1, "pyav", Storage(block_size=_BLOCK))
        info = decoding.info(srv.url(name))
        with av.open(long_av) as c:
            assert info.audio_packets is not None and len(info.audio_packets) == len(c.streams.audio[0].index_entries)
        decoding.decoder("pyav").container(info)  # opened once per worker, from the probe's blocks
        times = info.times()
        # Clips past the probe's blocks (the first GOPs, the last), starting just after a keyframe
        # (the audio's pre-roll reaches back past it), or not.
        fetched = 0
        for first in (76, 101, 127, 152, 180):
            frames = np.arange(first, first + 16, 2)[None]
            spans = clip_spans(times, frames)
            n = round((spans[0, 1] - spans[0, 0]) * RATE)
            got, want = (np.zeros((n, 1), np.float32), np.zeros((), np.int32)), \
                (np.zeros((n, 1), np.float32), np.zeros((), np.int32))
            before = len(srv.ranges)
            decoding.audio(info, spans, RATE, [got])
            # One request, for the planned bytes only; none where an earlier clip's fetch or the
            # probe's blocks hold them already (the encoder's packet sizes vary run to run).
            asked = srv.ranges[before:]
            assert len(asked) <= 1 and _blocks([(lo, hi) for _, lo, hi in asked]) <= \
                _blocks(audio_ranges(info.audio_packets, spans)), asked
            fetched += len(asked)
            local.audio(info_here, clip_spans(info_here.times(), frames), RATE, [want])
            assert int(got[1]) == int(want[1]) == n
            np.testing.assert_array_equal(got[0], want[0])
            assert np.abs(got[0]).max() > 0.02
        assert fetched >= 3


def test_reading_a_remote_clip_with_audio_asks_for_no_byte_past_its_prefetch(long_av):
    """A remote clip with audio, read as a worker reads it (``ClipReader.read``): every byte
    the server sends after the probe lies in the blocks the prefetch plan names (the frames'
    packets and the audio's), in no more requests than the plan has stretches: FFmpeg's
    read-ahead stops where the prefetched bytes do, and the demuxer reads no video packet of
    the GOP before the one the clip needs while it reads the audio's pre-roll. Clips start
    just after a keyframe, or not."""
    need_av(INDEX_ENTRIES, "fetching a remote clip's audio with its frames, placed by the MP4's index "
                           "(Stream.index_entries)")
    root, name = os.path.split(long_av)
    kw = dict(clip_len=8, frame_step=2, clips_per_video=16, sampling="uniform", audio_rate=RATE)
    want = shmloader.VideoClips([long_av], decoder="pyav", **kw).reader().read(range(16))
    with RangeServer(root, max_requests=2000) as srv:
        fetched = 0
        for i in range(16):
            clips = shmloader.VideoClips([srv.url(name)], fetch={"block_size": _BLOCK}, **kw)
            reader = clips.reader()
            info = reader.decoding.info(clips.paths[0])  # the probe, as a worker's first look
            mark = len(srv.ranges)
            got = reader.read([i])
            frames = got["frames"][0]
            plan = _blocks(byte_ranges(info, np.unique(frames)) +
                           audio_ranges(info.audio_packets, clip_spans(info.times(), frames[None])))
            asked = srv.ranges[mark:]
            # FFmpeg 9 (PyAV 19)'s seek to the clip's keyframe reads one block before the frames'
            # planned bytes in some clips (the video's read, not the audio's): allowed, one request.
            early = {min(plan) - 1}
            assert _blocks([(lo, hi) for _, lo, hi in asked]) <= plan | early, (i, frames, asked)
            runs = sum(1 for k in plan if k - 1 not in plan)
            extra = any(lo // _BLOCK in early for _, lo, _ in asked)
            assert len(asked) <= runs + extra, (i, asked)  # none, where the probe's blocks hold the clip
            fetched += bool(asked)
            np.testing.assert_array_equal(got["frames"][0], want["frames"][i])
            np.testing.assert_array_equal(got["audio"][0], want["audio"][i])
            np.testing.assert_array_equal(got["audio_len"][0], want["audio_len"][i])
        assert fetched >= 8


def test_a_remote_whole_video_samples_audio_is_the_local_files(long_av):
    """``sampling="segments"`` with audio over HTTP: a sample's sound spans the whole video, more
    than a small block cache holds (such a stretch is read as the demuxer asks, not fetched
    ahead, where its first blocks would leave the cache before they are read); the sound is the
    local file's to the bit."""
    root, name = os.path.split(long_av)
    kw = dict(clip_len=8, sampling="segments", audio_rate=RATE, audio_seconds=12)
    want = shmloader.VideoClips([long_av], decoder="pyav", **kw).reader().read([0])
    with RangeServer(root, max_requests=500) as srv:
        clips = shmloader.VideoClips([srv.url(name)], fetch={"block_size": _BLOCK, "cache_bytes": 64 << 10}, **kw)
        got = clips.reader().read([0])
    assert int(want["audio_len"][0]) > 10 * RATE  # from the first segment's frame to the last's end
    np.testing.assert_array_equal(got["frames"], want["frames"])
    np.testing.assert_array_equal(got["audio_len"], want["audio_len"])
    np.testing.assert_array_equal(got["audio"], want["audio"])
