"""Long videos cost per clip what short ones cost: a long MP4 is timed from its own index (a few
GOPs read, not every packet), and the frames delivered are exactly those a full read and a
sequential decode give; a timeline the index got wrong is caught while decoding and read again."""

from __future__ import annotations

import os

import av
import numpy as np
import pytest

import shmloader
from shmloader.video._av import INDEX_ENTRIES
from shmloader.video.decoding import Decoding
from shmloader.video.mp4index import INDEXED_MIN_FRAMES
from shmloader.video.probe import probe

from ._needs import need_av
from ._variants import codes, reference
from .test_shapes import write

pytestmark = pytest.mark.timeout(180)

LONG = INDEXED_MIN_FRAMES + 200  # just past where the index is used
GOP = 50


@pytest.fixture(scope="module")
def long_mp4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    return write(folder / "long.mp4", "libx264", bframes=3, frames=LONG, gop=GOP, size=(48, 64))


def _remux(src: str, dst: str, edit) -> str:
    with av.open(src) as i, av.open(dst, "w") as o:
        s = i.streams.video[0]
        out = o.add_stream_from_template(s)
        for n, p in enumerate(i.demux(s)):
            if p.dts is None:
                continue
            edit(n, p)
            p.stream = out
            o.mux(p)
    return dst


def _check_clips(path: str, info, decoding: Decoding, seed: int) -> None:
    _, numbers = codes(reference(path))
    rng = np.random.default_rng(seed)
    for start in rng.integers(0, info.frames - 8, 12):
        frames = np.arange(start, start + 8)
        np.testing.assert_array_equal(codes(decoding.decode(info, None, frames))[1], numbers[frames])


def test_a_long_mp4_is_timed_from_its_index_as_a_full_read_times_it(long_mp4):
    need_av(INDEX_ENTRIES, "timing a long MP4 from its own index (Stream.index_entries)")
    fast, full = probe(long_mp4), probe(long_mp4, index=False)
    assert fast.indexed and not full.indexed
    assert fast == full  # frames, size, fps, codec, rotation, decoder, problem...
    np.testing.assert_array_equal(fast.pts, full.pts)
    np.testing.assert_array_equal(fast.keyframes, full.keyframes)
    np.testing.assert_array_equal(fast.times(), full.times())
    assert list(fast.keyframes) == list(range(0, LONG, GOP))
    decoding = Decoding(1)
    _check_clips(long_mp4, fast, decoding, seed=0)
    assert decoding.reprobes == 0 and set(decoding.decodes) == {"pyav"}


def test_a_short_or_irregular_file_is_read_in_full(long_mp4, tmp_path):
    short = write(tmp_path / "short.mp4", "libx264", bframes=3, frames=INDEXED_MIN_FRAMES - 1)
    assert not probe(short).indexed
    tb_step = {}

    def jitter_first_gop(n, p):  # a variable-rate start: the index's grid does not hold
        tb_step.setdefault("d", int(round(1 / 25 / p.time_base)))
        if n == 3:
            p.dts += 1
            p.pts += 1

    vfr = _remux(long_mp4, str(tmp_path / "vfr.mp4"), jitter_first_gop)
    info = probe(vfr)
    assert not info.indexed and info.frames == LONG


def test_a_frame_off_the_index_timeline_sends_the_decoder_to_a_full_probe(long_mp4, tmp_path):
    """A middle B-frame stamped a tick late (its decode time unchanged): both ends of the file and
    every decode time are regular, so the index's grid is taken, and the decode that meets the
    frame reads the file again."""
    need_av(INDEX_ENTRIES, "timing a long MP4 from its own index (Stream.index_entries)")
    with av.open(long_mp4) as c:
        packets = [(p.pts, p.dts, p.is_keyframe) for p in c.demux(video=0) if p.dts is not None]
    middle = LONG // 2
    victim = next(n for n in range(middle, middle + GOP) if not packets[n][2] and packets[n][0] != packets[n][1])

    def nudge(n, p):
        if n == victim:
            p.pts += 1

    path = _remux(long_mp4, str(tmp_path / "nudged.mp4"), nudge)
    decoding = Decoding(1)
    info = decoding.info(path)  # as a worker reads it: probed once, kept
    assert info.indexed
    full = probe(path, index=False)
    shown = int(np.searchsorted(full.pts, packets[victim][0] + 1))
    frames = np.arange(shown - 4, shown + 4)
    _, numbers = codes(reference(path))
    np.testing.assert_array_equal(codes(decoding.decode(info, None, frames))[1], numbers[frames])
    assert decoding.reprobes == 1
    _check_clips(path, decoding.info(path), decoding, seed=1)  # the full probe is kept
    assert decoding.reprobes == 1


def test_the_loader_reads_long_videos_exactly(long_mp4, tmp_path):
    other = write(tmp_path / "other.mp4", "libx264", bframes=3, frames=LONG, gop=GOP, size=(48, 64))
    clips = shmloader.VideoClips([long_mp4, other], clip_len=8, frame_step=3, clips_per_video=6)
    refs = {p: codes(reference(p))[1] for p in (long_mp4, other)}
    with shmloader.Loader(clips, batch_size=4, workers=2, shuffle=True, seed=5, timeout=60) as loader:
        n = 0
        for b in loader:
            for i in range(len(b["index"])):
                path = clips.paths[int(b["index"][i])]
                np.testing.assert_array_equal(codes(b["video"][i])[1], refs[path][np.asarray(b["frames"][i])])
                n += 1
    assert n == len(clips)
    assert os.path.getsize(long_mp4) > 0


def test_pyav_keeps_a_container_per_file_until_the_file_changes(tmp_path):
    from shmloader.video.samples import write_video

    path = write_video(tmp_path / "v.mp4", 1, frames=40, size=(48, 64), gop=10)
    decoding = Decoding(1, "pyav")
    got = decoding.decode(decoding.info(path), None, np.arange(20, 24))
    assert (codes(got)[0] == 1).all()
    kept = decoding.decoder("pyav")._open[path][1]
    decoding.decode(decoding.info(path), None, np.arange(3, 6))
    assert decoding.decoder("pyav")._open[path][1] is kept  # the next clip reuses it
    os.replace(write_video(tmp_path / "w.mp4", 2, frames=50, size=(48, 64), gop=10), path)
    ids, numbers = codes(decoding.decode(decoding.info(path), None, np.arange(40, 44)))
    assert (ids == 2).all() and list(numbers) == [40, 41, 42, 43]  # the new file, not the kept container
    for i in range(6):  # a worker keeps at most a few
        other = write_video(tmp_path / f"o{i}.mp4", 3 + i, frames=12, size=(48, 64))
        decoding.decode(decoding.info(other), None, np.arange(2, 4))
    assert len(decoding.decoder("pyav")._open) == 4
