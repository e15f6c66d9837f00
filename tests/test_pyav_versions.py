"""PyAV across its versions (``shmloader.video._av``): what the installed PyAV can do is found by
looking at it, and each feature an older PyAV lacks (lerobot 0.6 pins av 15) has a way around it
that gives the same frames, or an error that names the feature and the install that has it.

These run on the lab's PyAV, which has every feature, by taking each feature away; the lerobot
lane (``make test-lerobot``) runs the whole suite on av 15, where they are really missing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import av
import numpy as np
import pytest
from packaging.version import Version

from shmloader.samples import read_codes, write_video
from shmloader.video import _av
from shmloader.video.probe import probe

from .test_bad_input import over_reported
from .test_prepare import bt709
from .test_long_videos import LONG, long_mp4  # noqa: F401 (a fixture)


def test_the_features_found_are_those_of_the_installed_pyav(tmp_path):
    """Each flag says what a container of the installed PyAV really has; from av 17.1 every one."""
    path = write_video(tmp_path / "a.mp4", 1, frames=4)
    with av.open(path) as c:
        assert _av.INDEX_ENTRIES == hasattr(c.streams.video[0], "index_entries")
    assert _av.GRAPH_THREADS == hasattr(av.filter.Graph(), "threads")
    if Version(av.__version__) >= Version(_av.NEWER_AV.removeprefix("av>=")):
        assert _av.INDEX_ENTRIES and _av.GRAPH_THREADS
    if _av.AV_MAJOR < 17:
        assert not _av.INDEX_ENTRIES  # Stream.index_entries came in av 17.0


def test_an_encoder_beside_decord_works_where_the_check_says_it_does():
    """With decord imported first (its FFmpeg's libraries in the global symbol scope), PyAV's VP9
    encoder opens where ``encodes_beside_decord`` says so, and fails where it says not (av 15's
    libvpx beside decord2's): the check is the behaviour, in a fresh interpreter."""
    code = textwrap.dedent("""
        import fractions, decord, av
        from shmloader.video._av import encodes_beside_decord
        cc = av.CodecContext.create("libvpx-vp9", "w")
        cc.width, cc.height, cc.pix_fmt, cc.time_base = 64, 48, "yuv420p", fractions.Fraction(1, 25)
        try:
            cc.open()
            opened = True
        except av.error.FFmpegError:
            opened = False
        print(opened, encodes_beside_decord("libvpx-vp9"), encodes_beside_decord("libx264"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    opened, said, x264 = out.stdout.split()
    assert opened == said and x264 == "True", out.stdout


def test_writing_a_codec_that_cannot_run_beside_decord_names_the_feature_and_the_fix(tmp_path, monkeypatch):
    """Where decord2 brings another ABI of libvpx than PyAV's (av 15), write_video raises before
    writing anything, naming what was asked and ``pip install 'av>=17.1'``; libx264 still writes."""
    import decord  # noqa: F401 (what the clash needs: decord imported in this process)

    monkeypatch.setattr(_av, "decord_clashes", lambda: frozenset({"libvpx"}))
    with pytest.raises(_av.NeedsNewerAV, match=r"writing libvpx-vp9 video in a process that imported decord .*"
                                               r"pip install 'av>=17\.1'"):
        write_video(tmp_path / "a.webm", 1, frames=4, codec="libvpx-vp9")
    assert not (tmp_path / "a.webm").exists()
    assert _av.encodes_beside_decord("libx264") and _av.encodes_beside_decord("libsvtav1")
    with av.open(write_video(tmp_path / "b.mp4", 2, frames=4)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    assert read_codes(frames)[0].tolist() == [2] * 4


def test_the_clashes_are_libraries_both_wheels_bundle_at_another_abi():
    """``decord_clashes`` reads the two wheels' file lists: a library named in both at one ABI
    version (the lab's av and decord2 bundle the same libvpx) is none."""
    mine, theirs = _av._bundled("av"), _av._bundled("decord2")
    assert mine and theirs, "PyAV's and decord2's wheels bundle their libraries: nothing was compared"
    assert _av.decord_clashes() == {n for n in mine.keys() & theirs.keys() if mine[n] != theirs[n]}
    assert ("libvpx" in _av.decord_clashes()) == (mine.get("libvpx") != theirs.get("libvpx"))


def test_without_the_index_a_long_mp4_is_timed_by_reading_its_packets(long_mp4, monkeypatch):  # noqa: F811
    """A PyAV without ``Stream.index_entries`` times a long MP4 by its packets: the same timeline,
    frame for frame, as the index gives (where this PyAV has one)."""
    with_index = probe(long_mp4)
    assert with_index.indexed == _av.INDEX_ENTRIES
    monkeypatch.setattr(_av, "INDEX_ENTRIES", False)
    without = probe(long_mp4)
    assert not without.indexed and without.frames == LONG and without.problem == ""
    assert without == with_index
    np.testing.assert_array_equal(without.pts, with_index.pts)
    np.testing.assert_array_equal(without.keyframes, with_index.keyframes)


def test_without_the_index_an_mp4_cut_short_is_found_by_its_boxes(tmp_path, monkeypatch):
    """A download that stopped inside the frame data (its index written first): the top-level
    boxes run past the end of the file, and the probe names it truncated as it does from the index."""
    cut = tmp_path / "cut.mp4"
    over_reported(cut)
    with open(cut, "rb") as f:
        assert _av.boxes_end(f) > cut.stat().st_size
    with open(write_video(tmp_path / "whole.mp4", 1, frames=4), "rb") as f:
        assert _av.boxes_end(f) is None
    with open(write_video(tmp_path / "stream.ts", 1, frames=4), "rb") as f:
        assert _av.boxes_end(f) is None  # no MP4 boxes at all
    with_index = probe(str(cut))
    monkeypatch.setattr(_av, "INDEX_ENTRIES", False)
    without = probe(str(cut))
    assert without.problem == f"truncated at frame {without.frames} of 40" and without.decoder == "pyav"
    assert (without.frames, without.problem) == (with_index.frames, with_index.problem)


def test_a_graph_without_threads_scales_on_one_thread_to_the_same_pixels(tmp_path):
    """Without ``Graph.threads``, every filter is told ``threads=1`` (by name or by keyword): the
    graph configures, and scaling gives the pixels the one-thread graph gives."""
    path = write_video(tmp_path / "a.mp4", 3, frames=2, size=(240, 320))
    with av.open(path) as c:
        frame = next(c.decode(video=0))

    def scaled(g) -> np.ndarray:
        chain = [g.add_buffer(width=frame.width, height=frame.height, format=frame.format, time_base="1/1000"),
                 g.add("scale", "64:48"), g.add("format", pix_fmts="rgb24"), g.add("buffersink")]
        for a, b in zip(chain, chain[1:]):
            a.link_to(b)
        g.configure()
        frame.pts = None
        g.push(frame)
        return g.pull().to_ndarray()

    one = scaled(_av._OneThreadFilters(av.filter.Graph()))
    np.testing.assert_array_equal(one, scaled(_av.filter_graph()))
    assert one.shape == (48, 64, 3) and read_codes(one)[0] == 3


def test_without_colour_tags_on_frames_a_copy_takes_the_decoders(tmp_path, monkeypatch):
    """The primaries and transfer a ``prepare`` copy is tagged with: a BT.709 source's, from its
    frames, or from the decoder where PyAV does not show them on frames (av 15)."""
    with av.open(bt709(str(tmp_path / "hd.mp4"), 1, frames=4)) as c:
        s = c.streams.video[0]
        frame = next(c.decode(s))
        here = _av.colour_tags(frame, s.codec_context)
        monkeypatch.setattr(_av, "FRAME_COLOUR", False)
        assert _av.colour_tags(frame, s.codec_context) == here == (1, 1)  # BT.709 primaries and transfer
