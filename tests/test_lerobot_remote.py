"""LeRobot v3 datasets read where they lie (``lerobot.dataset`` of an fsspec URL): the dataset of
``_lerobot_v3`` on moto's S3 server and on the HTTP Range server of ``_servers``, its epoch equal to
the local folder's value for value and pixel for pixel, its videos read by byte range, its errors
naming the file and never a credential.

Every server is bound to 127.0.0.1, started and stopped here."""

from __future__ import annotations

import glob
import os
import shutil

import numpy as np
import pytest

from shmloader import LoaderError
from shmloader import lerobot
from shmloader.samples import frame_image

from . import _lerobot_v3 as v3
from ._needs import need
from ._servers import RangeServer, moto_s3
from .test_lerobot import epoch

pytestmark = pytest.mark.timeout(240)

WINDOWS = {v3.FRONT: [-2 / v3.FPS, -1 / v3.FPS, 0.0], "action": [0.0, 1 / v3.FPS]}
MISSING = f"videos/{v3.FRONT}/chunk-000/file-001.mp4"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The dataset (``served/ds``), and a copy without one of its front camera's videos
    (``served/broken``)."""
    served = tmp_path_factory.mktemp("served")
    root = v3.write(str(served / "ds"))
    shutil.copytree(root, served / "broken")
    os.remove(served / "broken" / MISSING)
    return root


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    """The dataset with videos whose lower half is moving noise (as many bytes a frame as a real
    video's, ~60-130 KB a file), the frame codes kept in the upper half."""
    import av

    root = v3.write(str(tmp_path_factory.mktemp("textured") / "ds"))
    h, w = v3.SIZE
    for camera, vid in v3.CAMERAS.items():
        noise = np.random.default_rng(vid).integers(0, 256, (h, w, 3), dtype=np.uint8)
        for (chunk, file), episodes in v3.FILES[camera].items():
            path = os.path.join(root, "videos", camera, f"chunk-{chunk:03d}", f"file-{file:03d}.mp4")
            with av.open(path, "w") as c:
                s = c.add_stream("libx264", rate=v3.FPS)
                s.width, s.height, s.pix_fmt = w, h, "yuv420p"
                s.options = {"crf": "23", "preset": "ultrafast", "g": "5", "keyint_min": "5", "sc_threshold": "0"}
                for i in range(sum(v3.LENGTHS[e] for e in episodes)):
                    img = frame_image(vid, i, h, w).copy()
                    img[h // 2:] = np.roll(noise, (3 * i, 5 * i), axis=(0, 1))[h // 2:]
                    for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                        c.mux(p)
                for p in s.encode():
                    c.mux(p)
    return root


@pytest.fixture(scope="module")
def s3(written):
    """moto's S3 server holding ``s3://robots/ds`` and ``s3://robots/broken``; its storage_options."""
    s3fs = need("s3fs")
    need("moto.server")
    with moto_s3() as opts:
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("robots")
        served = os.path.dirname(written)
        for path in glob.glob(os.path.join(served, "**", "*"), recursive=True):
            if os.path.isfile(path):
                fs.put(path, "robots/" + os.path.relpath(path, served))
        yield opts


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k


def test_an_s3_dataset_equals_the_local_folder(written, s3):
    local = epoch(lerobot.dataset(written, delta_timestamps=WINDOWS))
    ds = lerobot.dataset("s3://robots/ds/", delta_timestamps=WINDOWS, storage_options=s3)
    assert ds.root == "s3://robots/ds" and ds.tasks == list(v3.TASKS) and ds.cameras == list(v3.CAMERAS)
    stats: dict = {}
    _same(epoch(ds, stats), local)
    assert stats["pyav"] > 0 and stats["decord"] == 0 and stats["bytes_read"] > 0  # PyAV reads remote files
    # Only the chosen episodes' data file is read (the data files meta/episodes names).
    assert lerobot.dataset("s3://robots/ds", episodes=[2], storage_options=s3).read([0])["index"][0] == sum(v3.LENGTHS[:2])


def test_an_http_dataset_equals_the_local_folder_read_by_byte_range(textured):
    """With 1 KiB blocks: each worker reads a video's bytes at most once an epoch (its block cache
    keeps them), not once per sample; a decode pass's frames come in one request, not block by
    block (a file is ~60-130 blocks), and a probe in a few."""
    served = os.path.dirname(textured)
    videos = [os.path.relpath(p, served) for p in glob.glob(os.path.join(textured, "videos", "*", "*", "*.mp4"))]
    total = sum(os.path.getsize(os.path.join(served, v)) for v in videos)
    local = epoch(lerobot.dataset(textured))
    with RangeServer(served) as srv:
        ds = lerobot.dataset(srv.url("ds"), fetch={"block_size": 1024})
        srv.reset_counts()
        stats: dict = {}
        _same(epoch(ds, stats), local)
        gets = [(p, e - s) for p, s, e in srv.ranges]
    assert {p for p, _ in gets} <= set(videos) and stats["bytes_read"] == srv.bytes_sent  # the workers' reads
    assert stats["decord"] == 0 and stats["pyav"] > 0
    assert srv.bytes_sent <= 2 * total, (srv.bytes_sent, total)  # 2 workers
    assert len(gets) <= stats["pyav"] + 4 * stats["probes"], (len(gets), stats["pyav"], stats["probes"])


def test_over_http_the_numbered_files_are_found_by_their_numbers(tmp_path):
    """http(s) lists nothing: ``meta/episodes`` files are tried in the writer's order, on into the
    next chunk after ``chunks_size`` files, and a gap in the numbering is an error."""
    import json

    import pyarrow.parquet as pq

    root = v3.write(str(tmp_path / "ds"))
    info_path = os.path.join(root, "meta", "info.json")
    with open(info_path) as f:
        info = json.load(f)
    with open(info_path, "w") as f:
        json.dump({**info, "chunks_size": 1}, f)
    episodes = os.path.join(root, "meta", "episodes")
    table = pq.read_table(os.path.join(episodes, "chunk-000", "file-000.parquet"))
    os.makedirs(os.path.join(episodes, "chunk-001"))
    pq.write_table(table.slice(0, 2), os.path.join(episodes, "chunk-000", "file-000.parquet"))
    pq.write_table(table.slice(2), os.path.join(episodes, "chunk-001", "file-000.parquet"))
    with RangeServer(str(tmp_path)) as srv:
        ds = lerobot.dataset(srv.url("ds"))
        assert ds.episodes == [0, 1, 2, 3] and len(ds) == sum(v3.LENGTHS)
        assert np.array_equal(ds.read(range(len(ds)))["index"], lerobot.dataset(root).read(range(len(ds)))["index"])
        os.remove(os.path.join(episodes, "chunk-001", "file-000.parquet"))
        with pytest.raises(ValueError, match="hold 2 episodes, meta/info.json says 4"):
            lerobot.dataset(srv.url("ds"))


def test_a_missing_file_is_named_without_credentials(written, s3, tmp_path):
    secret = s3["secret"]
    ds = lerobot.dataset("s3://robots/broken", storage_options=s3)  # the videos are read in the workers
    with pytest.raises(LoaderError) as caught:
        epoch(ds)
    assert f"s3://robots/broken/{MISSING}" in str(caught.value) and secret not in str(caught.value)
    with pytest.raises(FileNotFoundError) as missing:
        lerobot.dataset("s3://robots/nothing", storage_options=s3)
    assert "'s3://robots/nothing' is not a LeRobot dataset: it has no meta/info.json" in str(missing.value)
    with pytest.raises(ValueError, match="decoder='decord' reads local files only"):
        lerobot.dataset("s3://robots/ds", decoder="decord", storage_options=s3)
    # Over http: a password in the URL, or a token in storage_options, never shown; a data file
    # meta/episodes names, missing.
    shutil.copytree(written, tmp_path / "ds")
    os.remove(tmp_path / "ds" / "data" / "chunk-000" / "file-001.parquet")
    with RangeServer(str(tmp_path)) as srv:
        with pytest.raises(FileNotFoundError) as missing:
            lerobot.dataset(srv.url("ds").replace("http://", "http://someone:pa55word-x@"))
        with pytest.raises(FileNotFoundError) as nothing:
            lerobot.dataset(srv.url("nothing"), storage_options={"headers": {"Authorization": f"Bearer {secret}"}})
    assert f"{srv.url('ds')}/data/chunk-000/file-001.parquet" in str(missing.value), str(missing.value)
    assert "pa55word-x" not in str(missing.value)
    assert "no meta/info.json" in str(nothing.value) and secret not in str(nothing.value)
