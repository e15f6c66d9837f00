"""Videos read where they live: fsspec URLs (a local HTTP server with Range support written in
tests/_servers.py, and moto's S3 server) and WebDataset tar shards, by byte range.

Every server is bound to 127.0.0.1, started and stopped here, and bounds its request count.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import av
import numpy as np
import pytest

import shmloader
from shmloader import SampleError
from shmloader.video._av import INDEX_ENTRIES
from shmloader.video.decoding import Decoding
from shmloader.video.samples import frame_image, make_videos, read_codes
from shmloader.video.storage import Storage

from ._needs import need, need_av
from ._servers import RangeServer, moto_s3
from .conftest import state_after

pytestmark = pytest.mark.timeout(240)

SIZE = (96, 128)
LONG_FRAMES = 3000  # two minutes at 25 fps
GOP = 50


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Six frame-code videos (H.264 MP4, MPEG-4 AVI) and two tar shards of them with labels."""
    root = tmp_path_factory.mktemp("remote")
    h264, _ = make_videos(root, count=4, frames=48, size=SIZE, codec="libx264")
    avi = []
    for i in (4, 5):
        p = root / f"video_{i:03d}.avi"
        _write(p, i, 48, codec="mpeg4")
        avi.append(os.fspath(p))
    paths = h264 + avi
    for s in range(2):
        with tarfile.open(root / f"shard-{s:03d}.tar", "w") as t:
            for v in range(s * 3, s * 3 + 3):
                key = f"clip{v:04d}"
                t.add(paths[v], arcname=f"{key}.{paths[v].rsplit('.', 1)[1]}")
                _add(t, f"{key}.cls", str(v % 2))
                _add(t, f"{key}.json", json.dumps({"label": 10 + v, "caption": f"video {v}"}))
                _add(t, f"{key}.txt", f"video {v}")
    return root, paths


@pytest.fixture(scope="module")
def long_video(tmp_path_factory):
    """Two minutes of frame-code video (H.264 with B-frames, a keyframe every 50) whose lower
    half is moving noise, so that every frame holds as many bytes as a real one."""
    p = tmp_path_factory.mktemp("long") / "long.mp4"
    _write(p, 1, LONG_FRAMES, textured=True)
    return os.fspath(p)


def _write(path, vid: int, frames: int, codec: str = "libx264", textured: bool = False) -> None:
    h, w = SIZE
    noise = np.random.default_rng(vid).integers(0, 256, (h, w, 3), dtype=np.uint8)
    with av.open(os.fspath(path), "w") as c:
        s = c.add_stream(codec, rate=25)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        if codec == "libx264":
            s.options = {"crf": "23", "preset": "ultrafast", "g": str(GOP), "keyint_min": str(GOP),
                         "sc_threshold": "0", "bf": "2"}
        else:
            s.bit_rate, s.codec_context.gop_size = 2_000_000, 12
        for i in range(frames):
            img = frame_image(vid, i, h, w)
            if textured:  # bytes in every frame, as a real video has: the lower half moves
                img = img.copy()
                img[h // 2 :] = np.roll(noise, (3 * i, 5 * i), axis=(0, 1))[h // 2 :]
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def _add(t: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))


def _run(clips, **kw) -> tuple[list[dict], dict]:
    kw = {"batch_size": 3, "workers": 2, **kw}
    with shmloader.Loader(clips, **kw) as loader:
        batches = [{k: np.array(v) for k, v in b.items()} for b in loader]
        return batches, loader.stats()


def _check_codes(batches: list[dict], ids: bool = True) -> None:
    """Every frame is the one ``frames`` names, of the video ``index`` names (``ids``: the
    textured long video keeps only the frame numbers, in its upper half)."""
    for b in batches:
        got_ids, frames = read_codes(b["video"])
        np.testing.assert_array_equal(frames, b["frames"])
        if ids:
            np.testing.assert_array_equal(got_ids, np.broadcast_to(b["index"][:, None], got_ids.shape))


# -- URLs ----------------------------------------------------------------------------------------


def test_frames_from_urls_equal_frames_from_the_same_local_files(folder):
    root, paths = folder
    rel = [os.path.relpath(p, root) for p in paths]
    opts = dict(clip_len=8, clips_per_video=3, sampling="uniform", decoder="pyav")
    local, _ = _run(shmloader.VideoClips(paths, **opts))
    with RangeServer(root) as srv:
        remote, stats = _run(shmloader.VideoClips([srv.url(r) for r in rel], **opts))
        served = srv.bytes_sent
    assert len(remote) == len(local) == 6
    for a, b in zip(local, remote):
        np.testing.assert_array_equal(a["video"], b["video"])
        np.testing.assert_array_equal(a["frames"], b["frames"])
    _check_codes(remote)
    # Every byte the workers counted came from the server, and PyAV read every clip.
    assert stats["pyav"] > 0 and stats["decord"] == 0
    assert 0 < stats["bytes_read"] <= served and stats["requests"] > 0


def test_a_remote_file_is_read_by_pyav_whatever_its_shape(folder):
    root, paths = folder
    with RangeServer(root) as srv:
        url = srv.url(os.path.relpath(paths[0], root))
        info = Decoding(1, "auto", Storage()).info(url)
        assert info.decoder == "pyav" and info.frames == 48 and (info.height, info.width) == SIZE
        with pytest.raises(ValueError, match="decoder='decord' reads local files only"):
            shmloader.VideoClips([url], decoder="decord")


def test_clips_of_a_long_remote_video_fetch_a_few_percent_of_it(long_video):
    need_av(INDEX_ENTRIES, "probing a remote MP4 from its index, not its packets (Stream.index_entries)")
    root, name = os.path.split(long_video)
    size = os.path.getsize(long_video)
    with RangeServer(root) as srv:
        storage = Storage()
        decoding = Decoding(1, "auto", storage)
        info = decoding.info(srv.url(name))
        assert info.frames == LONG_FRAMES and info.indexed
        header = srv.bytes_sent
        assert header < 0.1 * size  # the probe reads the index and two GOPs, not the packets
        rng = np.random.default_rng(0)
        for start in rng.integers(0, LONG_FRAMES - 16, 10):
            before, asked = srv.bytes_sent, srv.gets
            frames = np.arange(start, start + 16)
            _, got = read_codes(decoding.decode(info, None, frames))
            np.testing.assert_array_equal(got, frames)
            assert srv.bytes_sent - before < 0.05 * size, f"clip at {start}: {srv.bytes_sent - before} of {size} bytes"
            assert srv.gets - asked <= 2  # fetched ahead in one request (two where a block was cached)

        # Through the loader: stats() counts what the workers fetched, and a task's clips are
        # fetched together (requests in flight at once), not one after another.
        srv.reset_counts()
        srv.latency = 0.05
        clips = shmloader.VideoClips([srv.url(name)], clip_len=16, clips_per_video=12, size=SIZE)
        batches, stats = _run(clips, batch_size=4, workers=1, shuffle=True)
        _check_codes(batches, ids=False)
        assert stats["bytes_read"] == srv.bytes_sent
        assert stats["bytes_read"] < header + 12 * 0.05 * size
        assert stats["bytes_per_sample"] == stats["bytes_read"] / stats["decoded"]
        assert srv.max_inflight >= 2


def test_a_task_of_many_files_never_met_probes_them_together(folder):
    """More files in one task than requests a worker sends at once: their probes run together
    (each probe's own reads run inside its thread), and every clip is right."""
    root, paths = folder
    rel = os.path.relpath(paths[0], root)
    with RangeServer(root, latency=0.02) as srv:
        urls = [f"{srv.url(rel)}?name={i}" for i in range(20)]  # 20 files to the worker, one video's bytes
        clips = shmloader.VideoClips(urls, clip_len=8, size=SIZE)
        batches, stats = _run(clips, batch_size=20, workers=1, timeout=60)
        assert srv.max_inflight >= 2
    assert sorted(_indices(batches)) == list(range(20)) and stats["skipped"] == 0
    for b in batches:
        np.testing.assert_array_equal(read_codes(b["video"])[1], b["frames"])


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_loader_probes_each_remote_file_once(folder, batch_size):
    """A file's clips spread over both workers: one of them probes it, the other takes that
    probe (video.probestore) and asks the server nothing for it. Batches of one sample probe a
    file at a time; batches of four probe several files together (``_probe_ahead``)."""
    root, paths = folder
    with RangeServer(root) as srv:
        urls = [srv.url(os.path.relpath(p, root)) for p in paths]
        clips = shmloader.VideoClips(urls, clip_len=4, clips_per_video=4, size=SIZE)
        batches, stats = _run(clips, batch_size=batch_size, workers=2, shuffle=True, seed=3, timeout=60)
    _check_codes(batches)
    assert sorted(_indices(batches)) == sorted(v for v in range(len(paths)) for _ in range(4))
    assert stats["probes"] == len(paths), stats  # without sharing: up to one per worker and file
    assert stats["skipped"] == 0


_HOLD = """
import sys, time
from shmloader.video.probestore import ProbeStore
store = ProbeStore.__new__(ProbeStore)
store.__setstate__({"fd": int(sys.argv[1]), "count": 4, "limit": 1 << 20})
assert store.try_probing(2)
print("held", flush=True)
time.sleep(120)
"""


def test_shared_probes_round_trip_and_no_lock_outlives_its_worker(folder):
    """A published probe comes back equal; a full segment publishes nothing; a worker waiting on
    another's probe waits at most ``wait_s``, and a worker that dies holding a file's lock frees it."""
    from shmloader.video.probe import probe
    from shmloader.video.probestore import ProbeStore

    _, paths = folder
    info = probe(paths[0])
    store = ProbeStore(4)
    try:
        assert store.get(1) is None
        assert store.put(1, info) and store.get(1) == info and store.get(0) is None
        tiny = ProbeStore(4, limit=256)
        assert not tiny.put(0, info) and tiny.get(0) is None
        tiny.close()
        holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(store.fd)], pass_fds=(store.fd,),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            t0 = time.monotonic()
            with store.probing(2, wait_s=0.3) as mine:
                assert not mine  # the other process probes file 2
            assert time.monotonic() - t0 >= 0.3
            with store.probing(3, wait_s=0.3) as mine:
                assert mine  # other files are free
        finally:
            holder.kill()
            holder.wait(timeout=30)
        with store.probing(2, wait_s=30) as mine:
            assert mine  # the lock died with its holder
    finally:
        store.close()


def test_failed_requests_are_retried_and_nothing_is_lost(folder):
    root, paths = folder
    rel = [os.path.relpath(p, root) for p in paths]
    with RangeServer(root) as srv:
        srv.faults.extend([("drop", 0), ("503", 0), ("stall", 3.0), ("503", 0), ("drop", 0), ("503", 0)])
        clips = shmloader.VideoClips([srv.url(r) for r in rel], clip_len=8, clips_per_video=2, size=SIZE,
                                     fetch={"timeout": 0.5, "retries": 4})
        batches, stats = _run(clips, timeout=60)
        assert srv.faults_hit == 6
    _check_codes(batches)
    assert sorted(np.concatenate([b["index"] for b in batches]).tolist()) == sorted(list(range(6)) * 2)
    assert stats["skipped"] == 0


def test_a_url_that_keeps_failing_is_a_sample_error_naming_it(folder):
    root, paths = folder
    rel = [os.path.relpath(p, root) for p in paths[:2]]
    with RangeServer(root) as srv:
        srv.broken.add(rel[0])
        urls = [srv.url(r) for r in rel]
        clips = shmloader.VideoClips(urls[:1], clip_len=8, size=SIZE, fetch={"retries": 2})
        with pytest.raises(SampleError) as e:
            _run(clips, batch_size=1, workers=1)
        assert urls[0] in str(e.value) and "failed 3 times" in e.value.reason and "503" in e.value.reason
        # The first try and two retries (fsspec asks HEAD, then GET, for a file's size), then no more.
        assert 3 <= srv.requests <= 6
        # Skipped instead: counted, and the other video delivered.
        clips = shmloader.VideoClips(urls, clip_len=8, size=SIZE, fetch={"retries": 2})
        batches, stats = _run(clips, batch_size=1, workers=1, on_error="skip")
    assert stats["skipped"] == 1 and [int(b["index"][0]) for b in batches] == [1]


def test_a_missing_object_is_named_and_credentials_never_shown(folder):
    root, paths = folder
    with RangeServer(root) as srv:
        # A password in the URL: the main process reads the first video's size.
        missing = srv.url("no/such.mp4").replace("http://", "http://someone:pa55word-x@")
        with pytest.raises(ValueError) as e:
            shmloader.VideoClips([missing], clip_len=8)
        assert "no/such.mp4: no such file or object" in str(e.value)
        assert isinstance(e.value.__cause__, FileNotFoundError) and "pa55word-x" not in str(e.value)
        assert srv.requests <= 2  # a missing object is not retried (fsspec asks HEAD, then GET)
        # A token in storage_options; in a worker: a SampleError that names the object.
        opts = {"headers": {"Authorization": "Bearer sekrit-token-1234"}}
        clips = shmloader.VideoClips([srv.url("no/such.mp4")], clip_len=8, size=SIZE, storage_options=opts)
        with pytest.raises(SampleError) as e:
            _run(clips, batch_size=1, workers=1)
        assert "no/such.mp4: no such file or object" in str(e.value)
        assert e.value.exc_type.endswith("FileNotFoundError") and "sekrit-token-1234" not in str(e.value)
        # Every failure of a request, redacted: the token is not in what the retries report either.
        srv.broken.add(os.path.relpath(paths[0], root))
        clips = shmloader.VideoClips([srv.url(os.path.relpath(paths[0], root))], clip_len=8, size=SIZE,
                                     storage_options=opts, fetch={"retries": 1})
        with pytest.raises(SampleError) as e:
            _run(clips, batch_size=1, workers=1)
        assert "failed 2 times" in str(e.value) and "sekrit-token-1234" not in str(e.value)


def test_ffmpeg_protocols_are_still_refused_and_a_missing_extra_is_named():
    for p in ("concat:a.mp4|b.mp4", "pipe:0"):
        with pytest.raises(ValueError, match="allow_urls=True"):
            shmloader.VideoClips([p], clip_len=4, size=SIZE)
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(ImportError, match=r'shmloader\[gcs\]'):
            shmloader.VideoClips(["gs://bucket/a.mp4"], clip_len=4)
    with pytest.raises(ValueError, match="fetch takes"):
        shmloader.VideoClips(["/a.mp4"], clip_len=4, size=SIZE, fetch={"retry": 3})


# -- tar shards ----------------------------------------------------------------------------------


def _indices(batches) -> list[int]:
    return np.concatenate([b["index"] for b in batches]).tolist()


def test_shards_give_every_member_once_with_its_label(folder):
    root, paths = folder
    clips = shmloader.VideoClips.from_shards(os.fspath(root / "shard-{000..001}.tar"), clip_len=8, size=SIZE)
    assert len(clips) == 6
    assert clips.paths[0] == f"tar://clip0000.mp4::{root / 'shard-000.tar'}"
    assert clips.paths[5] == f"tar://clip0005.avi::{root / 'shard-001.tar'}"
    batches, stats = _run(clips, shuffle=True, seed=3)
    _check_codes(batches)
    assert sorted(_indices(batches)) == list(range(6))
    labels = dict(zip(_indices(batches), np.concatenate([b["label"] for b in batches]).tolist()))
    assert labels == {v: v % 2 for v in range(6)}
    # A glob, and labels from a JSON field.
    clips = shmloader.VideoClips.from_shards(os.fspath(root / "shard-*.tar"), label_key="json:label",
                                             clip_len=8, size=SIZE)
    batches, _ = _run(clips)
    assert np.concatenate([b["label"] for b in batches]).tolist() == [10 + v for v in range(6)]
    # Members are read from their offsets: the workers never read a shard's headers.
    assert stats["bytes_read"] <= sum(os.path.getsize(p) for p in paths) + 6 * 2 * Storage().block_size


def test_shards_resume_and_split_across_hosts(folder):
    root, _ = folder
    clips = shmloader.VideoClips.from_shards(os.fspath(root / "shard-{000..001}.tar"), clip_len=8, size=SIZE,
                                             clips_per_video=2)
    full, _ = _run(clips, batch_size=2, shuffle=True, seed=5)
    taken, state = state_after(clips, 2, batch_size=2, workers=2, shuffle=True, seed=5)
    first = [b["index"] for b in taken]
    rest, _ = _run(clips, batch_size=2, shuffle=True, seed=5, state=state)
    assert np.concatenate(first).tolist() + _indices(rest) == _indices(full)
    one = clips.with_options(clips_per_video=1)  # a sample per member: hosts split the members
    hosts = [_indices(_run(one, batch_size=1, shard=(i, 2))[0]) for i in range(2)]
    assert not set(hosts[0]) & set(hosts[1]) and sorted(hosts[0] + hosts[1]) == list(range(6))


def test_bad_shards_give_clear_errors(folder, tmp_path):
    root, paths = folder
    whole = (root / "shard-000.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.tar.*cut off"):
        shmloader.VideoClips.from_shards(os.fspath(cut), clip_len=8, size=SIZE)
    not_tar = tmp_path / "not.tar"
    not_tar.write_bytes(b"\x00garbage" * 200)
    with pytest.raises(ValueError, match=r"not\.tar"):
        shmloader.VideoClips.from_shards(os.fspath(not_tar), clip_len=8, size=SIZE)
    with pytest.raises(ValueError, match="no shards match"):
        shmloader.VideoClips.from_shards(os.fspath(tmp_path / "none-*.tar"), clip_len=8)
    # A member that is not a video: a SampleError naming the member and the shard.
    odd = tmp_path / "odd.tar"
    with tarfile.open(odd, "w") as t:
        t.add(paths[0], arcname="a.mp4")
        _add(t, "a.cls", "0")
        _add(t, "b.mp4", "this is not a video")
        _add(t, "b.cls", "1")
        _add(t, "c.mp4", "neither")
        _add(t, "c.cls", "one")
    with pytest.raises(ValueError, match=r"sample 'c' of .*odd\.tar.*not an integer"):
        shmloader.VideoClips.from_shards(os.fspath(odd), clip_len=8, size=SIZE)
    clips = shmloader.VideoClips.from_shards(os.fspath(odd), label_key=None, clip_len=8, size=SIZE)
    with pytest.raises(SampleError, match=r"tar://b\.mp4::.*odd\.tar"):
        _run(clips, batch_size=1, workers=1)
    batches, stats = _run(clips, batch_size=1, workers=1, on_error="skip")
    assert _indices(batches) == [0] and stats["skipped"] == 2


def test_remote_shards_over_http(folder):
    root, _ = folder
    with RangeServer(root) as srv:
        clips = shmloader.VideoClips.from_shards(srv.url("shard-{000..001}.tar"), clip_len=8, size=SIZE,
                                                 clips_per_video=2)
        batches, stats = _run(clips, shuffle=True)
        assert stats["bytes_read"] > 0
    _check_codes(batches)
    assert sorted(_indices(batches)) == sorted(list(range(6)) * 2)


# -- S3 ------------------------------------------------------------------------------------------


def test_s3_videos_and_shards_equal_the_local_files(folder):
    need("s3fs")
    need("moto.server")
    import s3fs

    root, paths = folder
    with moto_s3() as opts:
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("videos")
        for p in paths:
            fs.put(p, f"videos/clips/{os.path.basename(p)}")
        for s in range(2):
            fs.put(os.fspath(root / f"shard-{s:03d}.tar"), f"videos/shards/shard-{s:03d}.tar")
        urls = [f"s3://videos/clips/{os.path.basename(p)}" for p in paths]
        options = dict(clip_len=8, clips_per_video=2, sampling="uniform", decoder="pyav")
        remote, stats = _run(shmloader.VideoClips(urls, storage_options=opts, **options))
        shards, _ = _run(shmloader.VideoClips.from_shards("s3://videos/shards/*.tar", storage_options=opts,
                                                          **options))
    local, _ = _run(shmloader.VideoClips(paths, **options))
    for a, b, c in zip(local, remote, shards):
        np.testing.assert_array_equal(a["video"], b["video"])
        np.testing.assert_array_equal(a["video"], c["video"])
        np.testing.assert_array_equal(a["frames"], c["frames"])
    assert stats["bytes_read"] > 0


def test_no_credentials_is_said_at_once_with_what_to_set(folder, monkeypatch):
    """An S3 server and no credentials anywhere: the first read says so, and what to set, at once
    (no try would find them: not retried); for clips and for a planned family alike."""
    need("s3fs")
    need("moto.server")
    from .families import thumbnails

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with moto_s3() as opts:
        nobody = {"client_kwargs": opts["client_kwargs"], "skip_instance_cache": True}
        url = "s3://videos/clips/a.mp4"
        with pytest.raises(ValueError) as e:
            shmloader.VideoClips([url], clip_len=8, storage_options=nobody)  # size=None: read here
        assert isinstance(e.value.__cause__, PermissionError)
        for said in ("no credentials found for s3://", "storage_options={'key': ..., 'secret': ...}", "'anon': True"):
            assert said in str(e.value), str(e.value)
        assert "failed" not in str(e.value)  # not retried
        with pytest.raises(ValueError, match=r"1 of 1 videos cannot be read.*no credentials found for s3://"):
            thumbnails.clips([url], storage_options=nobody)


# -- scan ----------------------------------------------------------------------------------------


def _scan(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "shmloader", "scan", *args, "--workers", "2", "--quiet"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return r


def test_scan_reads_urls_prefixes_and_shards_and_from_csv_trusts_the_offsets(folder, tmp_path):
    import csv
    import shutil

    root, paths = folder
    served = tmp_path / "served"
    served.mkdir()
    for s in range(2):
        shutil.copy(root / f"shard-{s:03d}.tar", served / f"shard-{s:03d}.tar")
    (tmp_path / "list.txt").write_text("# two URLs\n")
    out = tmp_path / "manifest.csv"
    with RangeServer(root) as files, RangeServer(served) as srv:
        urls = [files.url(os.path.relpath(p, root)) for p in paths[3:5]]
        (tmp_path / "list.txt").write_text("# two URLs\n" + "\n".join(urls) + "\n")
        _scan(str(tmp_path / "list.txt"), srv.url("shard-{000..001}.tar"), "--out", str(out))
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
        # The list's URLs, then every video member of the shards in order, labelled by its .cls,
        # with its offset in the shard.
        members = [(f"tar://clip{v:04d}.{paths[v].rsplit('.', 1)[1]}::{srv.url(f'shard-{v // 3:03d}.tar')}", v % 2)
                   for v in range(6)]
        assert [(r["path"], int(r["label"])) for r in rows] == [(u, -1) for u in urls] + members
        assert all(r["problem"] == "" and r["decoder"] == "pyav" and int(r["frames"]) == 48 for r in rows), rows
        for v, r in enumerate(rows[2:]):
            with tarfile.open(root / f"shard-{v // 3:03d}.tar") as t:
                m = t.getmember(f"clip{v:04d}.{paths[v].rsplit('.', 1)[1]}")
            assert (int(r["offset"]), int(r["bytes"])) == (m.offset_data, m.size)
        assert rows[0]["offset"] == rows[1]["offset"] == "" and int(rows[0]["bytes"]) == os.path.getsize(paths[3])
        # Run again: every remote row kept, its stamp compared by a worker; a file changed since
        # (its modification time, as the server reports it) is probed again.
        again = _scan(str(tmp_path / "list.txt"), srv.url("shard-{000..001}.tar"), "--out", str(out))
        assert "8 rows from an earlier run: 8 kept, 0 probed again" in again.stderr, again.stderr
        st = os.stat(paths[3])
        os.utime(paths[3], ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
        touched = _scan(str(tmp_path / "list.txt"), srv.url("shard-{000..001}.tar"), "--out", str(out))
        assert "8 rows from an earlier run: 7 kept, 1 probed again (changed since: 1)" in touched.stderr, touched.stderr
        with open(out, newline="") as f:
            assert [r["path"] for r in csv.DictReader(f)] == [r["path"] for r in rows]

        # The workers take the members' places from the manifest: with every tar header of the
        # shards overwritten (size and modification time kept, so the rows still hold), no shard
        # is read for its headers and every clip is still right.
        for s in range(2):
            shard = served / f"shard-{s:03d}.tar"
            st = os.stat(shard)
            data = bytearray(shard.read_bytes())
            with tarfile.open(shard) as t:
                for m in t.getmembers():
                    data[m.offset : m.offset + 512] = b"\xff" * 512
            shard.write_bytes(bytes(data))
            os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(ValueError, match="not a readable tar"):
            shmloader.VideoClips.from_shards(srv.url("shard-000.tar"), clip_len=8, size=SIZE)
        clips = shmloader.VideoClips.from_csv(out, clip_len=8, size=SIZE, clips_per_video=2)
        batches, stats = _run(clips, shuffle=True)
    assert sorted(_indices(batches)) == sorted(list(range(8)) * 2) and stats["skipped"] == 0
    for b in batches:
        np.testing.assert_array_equal(read_codes(b["video"])[1], b["frames"])


def test_scan_lists_a_bucket_prefix_with_class_folders(folder, tmp_path):
    need("s3fs")
    need("moto.server")
    import csv
    import json
    import s3fs

    _, paths = folder
    out = tmp_path / "manifest.csv"
    with moto_s3() as opts:
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("data")
        fs.put(paths[0], "data/videos/cats/a.mp4")
        fs.put(paths[4], "data/videos/dogs/b.avi")
        fs.put(paths[1], "data/videos/loose.mp4")
        fs.pipe("data/videos/notes.txt", b"not a video")
        r = _scan("s3://data/videos/", "--out", str(out), "--storage-options", json.dumps(opts))
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
        # Loose files first, unlabelled; then the class folders, labelled in sorted order.
        assert [(r["path"], int(r["label"])) for r in rows] == [
            ("s3://data/videos/loose.mp4", -1), ("s3://data/videos/cats/a.mp4", 0), ("s3://data/videos/dogs/b.avi", 1)]
        assert all(row["problem"] == "" and int(row["frames"]) == 48 for row in rows)
        assert "passed over 1 file without a video extension (.txt 1)" in r.stderr
        assert opts["secret"] not in out.read_text()


def test_a_server_that_ignores_range_is_said_once_and_read_once(folder):
    """A server that sends the whole file for a part (as Python's ``http.server`` does): one warning
    naming it, the file read once per process and kept (not once a request), and stats() counting
    the bytes the server sent."""
    root, paths = folder
    size = os.path.getsize(paths[0])
    with RangeServer(root, honour_range=False) as srv:
        url = srv.url(os.path.basename(paths[0]))
        storage = Storage(block_size=512)  # blocks smaller than the file: a range is a part of it
        with pytest.warns(RuntimeWarning, match=r"ignores HTTP Range requests and sent the whole file") as seen:
            head = storage.read(url, 0, 300)
            tail = storage.read(url, size - 300, size)
            storage.read(srv.url(os.path.basename(paths[1])), 0, 10)  # another file of the host: not said again
        assert len([w for w in seen if issubclass(w.category, RuntimeWarning)]) == 1
        data = open(paths[0], "rb").read()
        assert head == data[:300] and tail == data[-300:]
        assert srv.gets == 2 and storage.counters()["bytes_read"] == size + os.path.getsize(paths[1])
        srv.gets = srv.bytes_sent = 0
        batches, stats = _run(shmloader.VideoClips([url], clip_len=4, clips_per_video=4, size=(48, 64),
                                                   fetch={"block_size": 512}), workers=1, batch_size=4)
    _check_codes(batches)
    assert sum(len(b["index"]) for b in batches) == 4
    # the worker's first contact asks for the file's first and last blocks together: two answers
    # at most, whatever the clips read afterwards
    assert srv.gets <= 2 and stats["bytes_read"] == srv.bytes_sent == srv.gets * size
