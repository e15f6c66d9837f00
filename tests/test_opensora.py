"""shmloader.opensora: Open-Sora 2.0's buckets (hpcaitech/Open-Sora ``opensora/datasets/``:
``aspect.py``, ``bucket.py``, ``utils.py``, ``sampler.py``, ``datasets.py``; not on PyPI, so its
rules are stated here as worked cases), and the loader's batches of one bucket each: their sizes
and shapes, the frames by ``linspace`` over a seeded window, the pixels against a bilinear
resize-to-fill and centre crop of the same frames decoded whole (PSNR >= 33 dB: ours are decoded
at the size by the decoder's scaler, theirs at full size and interpolated), resume, shards, and
the frameworks' adapters."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from shmloader import Loader, opensora
from shmloader.engine.buckets import bucket_plan
from shmloader.opensora import BucketTable, aspect_sizes, pixels_of
from shmloader.opensora.buckets import interval_for
from shmloader.samples import write_video

from ._needs import need

pytestmark = pytest.mark.timeout(180)

# The config of Open-Sora's examples, in small: two resolutions, two lengths, a 0.5 chance to keep 360p.
CONFIG = {"256px": {33: (1.0, 2), 17: (1.0, 4)}, "360p": {33: (0.5, 2), 17: (1.0, 2)}}
# What the test videos fit: 96x128 and 128x96 at 25 fps (interval 2), 40 frames hold 20.
SMALL = {"64px": {17: (1.0, 2), 9: (1.0, 3)}, "96px": {17: ((0.5, 0.3), 2)}}
PSNR_DB = 33


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Five landscape and two portrait videos the buckets hold, one too small for any bucket."""
    folder = tmp_path_factory.mktemp("opensora")
    shapes = [(96, 128)] * 5 + [(128, 96)] * 2 + [(40, 48)]
    paths = [write_video(folder / f"v{i}.mp4", i, frames=40, size=size, fps=25) for i, size in enumerate(shapes)]
    return folder, [str(p) for p in paths], [f"a caption of video {i}" for i in range(len(paths))]


@pytest.fixture(scope="module")
def videos(files):
    _, paths, captions = files
    return opensora.clips(paths, captions, bucket_config=SMALL)


# ----------------------------------------------------------------- the rules
def test_resolution_names_and_their_aspect_tables():
    assert (pixels_of("256px"), pixels_of("360p"), pixels_of("720p")) == (65536, 230400, 921600)
    table = aspect_sizes(pixels_of("360p"))
    assert table["16:9"] == (352, 656) and table["9:16"] == (656, 352)  # landscape and its portrait twin
    assert all(h % 16 == 0 and w % 16 == 0 for h, w in table.values())
    assert all(abs(h * w - 230400) <= 16 * max(h, w) for h, w in table.values())  # a step from the pixels
    assert aspect_sizes(65536)["1:1"] == (256, 256)
    assert len(BucketTable(CONFIG)) == 48  # (13 + 11 aspect ratios) x 2 lengths


def test_a_videos_bucket_follows_open_soras_search():
    t = BucketTable(CONFIG)

    def name(k: int) -> str | None:
        return None if k < 0 else t.names[k]

    # 640x360 at 30 fps, 150 frames: read every 2nd frame (30 >= 16), 75 frames; 360p holds 33 of
    # them and keeps them with 0.5 (the first draw), else the next resolution, 256px, at 33 frames.
    seen = set()
    for seed in range(40):
        kept = np.random.default_rng(seed).random() <= 0.5
        got = name(t.bucket(150, 360, 640, 30.0, seed, 16))
        assert got == ("360p 33x352x656 (16:9)" if kept else "256px 33x192x336 (16:9)"), seed
        portrait = name(t.bucket(150, 640, 360, 30.0, seed, 16))
        assert portrait == ("360p 33x656x352 (9:16)" if kept else "256px 33x336x192 (9:16)"), seed
        seen.add(got)
    assert len(seen) == 2
    assert name(t.bucket(39, 256, 256, 16, 0, 16)) == "256px 33x256x256 (1:1)"  # 16 fps: every frame
    assert name(t.bucket(39, 256, 256, 30, 0, 16)) == "256px 17x256x256 (1:1)"  # 30 fps: 19 frames
    assert t.bucket(16, 256, 256, 16, 0, 16) == -1  # shorter than every length
    assert t.bucket(200, 200, 200, 16, 0, 16) == -1  # 40 000 pixels, under 0.8 of 256px's
    assert name(t.bucket(40, 230, 230, 16, 0, 16)) == "256px 33x256x256 (1:1)"  # 52 900: within 0.8
    assert (interval_for(15.0, 16), interval_for(16.0, 16), interval_for(60.0, 16), interval_for(float("nan"), 16)) == \
        (1, 1, 4, 1)


def test_a_probability_pair_skips_to_a_shorter_length_first():
    t = BucketTable({"256px": {33: ((1.0, 0.5), 2), 17: (1.0, 4)}})
    for seed in range(30):
        skip = np.random.default_rng(seed).random() <= 0.5
        assert t.names[t.bucket(40, 256, 256, 16, seed, 16)].startswith("256px 17x" if skip else "256px 33x"), seed


def test_each_video_draws_from_seed_plus_epoch_plus_its_row_times_the_buckets():
    t = BucketTable(CONFIG)
    n, k = 40, len(t)
    columns = (np.full(n, 150), np.full(n, 360), np.full(n, 640), np.full(n, 30.0))
    epochs = {}
    for seed, epoch in ((0, 0), (0, 1), (5, 2)):
        got = t.assign(*columns, seed=seed, epoch=epoch, fps_max=16)
        assert got.tolist() == [t.bucket(150, 360, 640, 30.0, seed + epoch + i * k, 16) for i in range(n)]
        epochs[(seed, epoch)] = got
    assert not np.array_equal(epochs[(0, 0)], epochs[(0, 1)])  # another epoch, other draws
    rows = np.arange(n) + 7  # the videos' rows in the table (others left out before them)
    got = t.assign(*columns, seed=0, epoch=0, fps_max=16, ids=rows)
    assert got.tolist() == [t.bucket(150, 360, 640, 30.0, (i + 7) * k, 16) for i in range(n)]


def test_a_tables_buckets_are_each_videos_own_search():
    """assign() searches videos alike together (draws for all of them at once): the same buckets
    as each video's own search, over lengths, sizes, rates, images, pairs and chances."""
    config = {"256px": {33: ((0.7, 0.4), 2), 17: (0.8, 4), 1: (0.5, 8)}, "360p": {33: (0.5, 2), 17: ((1.0, 0.3), 2)},
              "480p": {65: ((0.3, 0.6), 1), 33: (0.9, 1)}}
    t = BucketTable(config)
    rng = np.random.default_rng(7)
    n = 600
    sizes = np.array([(360, 640), (480, 854), (640, 360), (256, 256), (230, 230), (200, 200), (720, 1280)])[rng.integers(0, 7, n)]
    frames = np.where(rng.random(n) < 0.1, 1, rng.integers(2, 300, n))
    rates = rng.choice([12.0, 16.0, 24.0, 30.0, 60.0, np.nan], n)
    rows = rng.permutation(n * 3)[:n]
    got = t.assign(frames, sizes[:, 0], sizes[:, 1], rates, seed=11, epoch=3, fps_max=16, ids=rows)
    want = [t.bucket(int(f), int(h), int(w), float(r), 11 + 3 + int(i) * len(t), 16)
            for f, (h, w), r, i in zip(frames, sizes, rates, rows)]
    assert got.tolist() == want
    assert len(set(want)) > 10 and -1 in want  # many buckets met, and videos none holds


def test_one_frame_videos_and_images_take_a_one_frame_bucket():
    t = BucketTable({"256px": {17: (1.0, 2), 1: (1.0, 8)}})
    k = t.bucket(1, 256, 256, 16, 0, 16)
    assert t.names[k].startswith("256px 1x256x256") and t.batch_sizes[k] == 8
    assert BucketTable({"256px": {17: (1.0, 2)}}).bucket(1, 256, 256, 16, 0, 16) == -1


@pytest.mark.parametrize("config, words", [
    ({"300x": {17: (1.0, 2)}}, "'300x' is not a name like '256px'"),
    ({"256px": {17: (1.5, 2)}}, r"probabilities must lie in \[0, 1\]"),
    ({"256px": {17: (1.0, 0)}}, "batch size must be an integer >= 1"),
    ({"256px": {0: (1.0, 2)}}, "a length must be a number of frames >= 1"),
    ({"256px": {17: 2}}, r"must be \(probability, batch_size\)"),
    ({"256px_ar7:3": {17: (1.0, 2)}}, "'ar7:3' is neither 'max' nor an aspect ratio"),
    ({}, "non-empty"),
])
def test_a_config_it_cannot_read_is_refused_in_words(config, words, files):
    _, paths, _ = files
    with pytest.raises(ValueError, match=words):
        opensora.clips(paths[:1], bucket_config=config)


def test_an_epochs_plan_holds_each_assigned_sample_in_batches_of_its_bucket():
    ids = np.random.default_rng(0).integers(-1, 3, 61)
    sizes = np.array([2, 3, 4])

    def plan(**kw):
        kw = {"seed": 1, "epoch": 0, "shuffle": True, "drop_remainder": False, "shard": (0, 1), **kw}
        order, cuts = bucket_plan(ids, sizes, **kw)
        return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    batches = plan()
    for b in batches:
        assert len(set(ids[b])) == 1 and len(b) == sizes[ids[b[0]]]
    got = np.concatenate(batches)
    for k, size in enumerate(sizes):
        members = np.flatnonzero(ids == k)
        mine = got[ids[got] == k]
        assert set(mine) == set(members) and len(mine) == -(-len(members) // size) * size  # padded by repeats
    assert [b.tolist() for b in plan()] == [b.tolist() for b in batches]  # seeded
    assert [b.tolist() for b in plan(epoch=1)] != [b.tolist() for b in batches]
    dropped = np.concatenate(plan(drop_remainder=True))
    assert len(set(dropped)) == len(dropped) and all(len(b) == sizes[ids[b[0]]] for b in plan(drop_remainder=True))
    shards = [plan(shard=(r, 3)) for r in range(3)]
    assert len({len(s) for s in shards}) == 1  # every rank the same number of steps
    assert {i for s in shards for b in s for i in b.tolist()} == set(np.flatnonzero(ids >= 0))
    kept = sorted(i for s in (plan(shard=(r, 3), drop_remainder=True) for r in range(3)) for b in s for i in b.tolist())
    assert len(kept) == len(set(kept))


# --------------------------------------------------------------- the loader
def test_the_loader_gives_batches_of_one_bucket_at_its_batch_size(videos, files):
    _, _, captions = files
    seen: list[list[int]] = []
    delivered = 0
    with Loader(videos, shuffle=True, seed=3, workers=2, epochs=2) as loader:
        assert loader.buckets is not None and loader.batch_size == 3
        for batch in loader:
            k = int(batch["bucket"][0])
            t, h, w = videos.table.shapes[k]
            n = len(batch["index"])
            assert (batch["bucket"] == k).all() and n == videos.table.batch_sizes[k]
            assert batch["video"].shape == (n, t, h, w, 3) and batch["video"].dtype == np.uint8
            assert batch["frames"].shape == (n, t) and (batch["thw"] == (t, h, w)).all()
            assert batch["caption"].tolist() == [captions[i] for i in batch["index"]]
            np.testing.assert_allclose(batch["fps"], 12.0)  # 25 fps read every 2nd frame: floor(25 / 2)
            seen.append(batch["index"].tolist())
            delivered += int(batch["frames"].size)
        stats = loader.stats()
        assert stats["left_out"] == 1  # the 40x48 video: no bucket holds it
        assert stats["frames_delivered"] == delivered <= stats["frames_decoded"]  # stats_line's frames per frame
    want = []
    for epoch in (0, 1):
        order, cuts = bucket_plan(videos.assign(3, epoch), videos.table.batch_sizes, seed=3, epoch=epoch, shuffle=True,
                                  drop_remainder=False, shard=(0, 1))
        want += [order[a:b].tolist() for a, b in zip(cuts[:-1], cuts[1:])]
    assert seen == want
    assert {i for b in seen for i in b} == set(range(7))  # every video a bucket holds, every epoch


def test_frames_and_pixels_are_open_soras(videos, files):
    torch = need("torch")
    import av

    _, paths, _ = files
    for sample in (0, 5):  # a landscape and a portrait video
        batch = videos.reader().read([sample], seed=3, epoch=0)
        picked = batch["frames"][0]
        t, h, w = batch["thw"][0].tolist()
        window = t * 2  # 25 fps under fps_max 16: every 2nd frame
        assert any(np.array_equal(np.linspace(s, min(s + window, 40) - 1, t).astype(int), picked)
                   for s in range(0, max(0, 40 - window - 1) + 1)), picked
        with av.open(paths[sample]) as c:
            whole = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
        frames = torch.from_numpy(whole[picked]).permute(0, 3, 1, 2).float()
        fh, fw = whole.shape[1:3]
        (sh, sw), (top, left) = opensora.source.fill_size(fh, fw, (h, w))
        scaled = torch.nn.functional.interpolate(frames, size=(sh, sw), mode="bilinear", align_corners=False)
        theirs = scaled[:, :, top : top + h, left : left + w].permute(0, 2, 3, 1).round().clamp(0, 255).numpy()
        assert psnr(batch["video"][0], theirs) >= PSNR_DB, (sample, psnr(batch["video"][0], theirs))
    # the loader reads a sample as the reader does, for the same seed and epoch
    with Loader(videos, seed=3, workers=1) as loader:
        for got in loader:
            if 0 in got["index"].tolist():
                j = got["index"].tolist().index(0)
                assert np.array_equal(got["video"][j], videos.reader().read([0], seed=3, epoch=0)["video"][0])
                break


def test_a_saved_state_resumes_the_same_batches(videos, files):
    def run(**kw):
        with Loader(videos, shuffle=True, seed=5, epochs=2, workers=2, **kw) as loader:
            return [(b["index"].tolist(), int(b["video"].sum())) for b in loader], loader

    whole, _ = run()
    with Loader(videos, shuffle=True, seed=5, epochs=2, workers=2) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state()
    rest, _ = run(state=state)
    assert rest == whole[3:]
    _, paths, captions = files
    other = opensora.clips(paths, captions, bucket_config={"64px": {17: (1.0, 2), 9: (1.0, 2)}})
    with pytest.raises(ValueError, match="another dataset|other settings"):
        Loader(other, shuffle=True, seed=5, epochs=2, workers=1, state=state)


def test_shards_take_the_same_number_of_batches_and_together_every_video(videos):
    per = []
    for rank in (0, 1):
        with Loader(videos, shuffle=True, seed=1, shard=(rank, 2), workers=1) as loader:
            per.append([b["index"].tolist() for b in loader])
    assert len(per[0]) == len(per[1])
    assert {i for s in per for b in s for i in b} == set(range(7))


def test_the_frameworks_take_each_bucket_in_its_shape(videos):
    tf = need("tensorflow")
    with Loader(videos, seed=0, workers=1) as loader:
        for batch in loader.as_dataset().take(2):
            t, h, w = batch["thw"][0].numpy().tolist()
            assert batch["video"].shape[1:] == (t, h, w, 3) and batch["caption"].dtype == tf.string
            assert batch["caption"][0].numpy().decode().startswith("a caption of video")
    with Loader(videos, seed=0, workers=1) as loader, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: the pin thread copies into ordinary buffers
        for batch in loader.as_torch(pin_memory=True):
            t, h, w = batch["thw"][0].tolist()
            assert tuple(batch["video"].shape[1:]) == (t, h, w, 3) and isinstance(batch["caption"], list)
    jax_batches = need("shmloader.jax").batches
    with Loader(videos, seed=0, workers=1) as loader:
        shapes = {tuple(b["video"].shape) for b in jax_batches(loader)}
        assert all(len(s) == 5 for s in shapes) and len(shapes) >= 2  # a static shape per bucket


# ------------------------------------------------------------ tables, bad input
def _table(files, rows=None):
    folder, paths, captions = files
    names = [os.path.basename(p) for p in paths]
    meta = [(40, 96, 128, 25.0)] * 5 + [(40, 128, 96, 25.0)] * 2 + [(40, 40, 48, 25.0)]
    return {"path": names, "text": captions, "num_frames": [m[0] for m in meta], "height": [m[1] for m in meta],
            "width": [m[2] for m in meta], "fps": [m[3] for m in meta], **(rows or {})}


def test_open_soras_data_files_plan_without_opening_a_video(files, tmp_path):
    pa = need("pyarrow")
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    folder, paths, captions = files
    columns = _table(files)
    columns["path"] = [*columns["path"][:-1], "not-there.mp4"]  # planned from its row: never opened here
    pacsv.write_csv(pa.table(columns), tmp_path / "train.csv")
    pq.write_table(pa.table(columns), tmp_path / "train.parquet")
    for name in ("train.csv", "train.parquet"):
        v = opensora.from_table(tmp_path / name, root=folder, bucket_config=SMALL)
        assert len(v) == 8 and v.captions == captions and v.assign(0, 0)[-1] == -1
        assert v.fingerprint() == opensora.from_table(columns, root=folder, bucket_config=SMALL).fingerprint()
    with Loader(opensora.from_table(columns, root=folder, bucket_config=SMALL), seed=0, workers=1) as loader:
        assert {i for b in loader for i in b["index"].tolist()} == set(range(7))
    with pytest.raises(ValueError, match="lacks column fps"):
        opensora.from_table({k: v for k, v in columns.items() if k != "fps"}, root=folder, bucket_config=SMALL)
    bad = _table(files, {"num_frames": [40] * 7 + [0]})
    with pytest.raises(ValueError, match=r"v7\.mp4: the table gives it 0\.0 frames"):
        opensora.from_table(bad, root=folder, bucket_config=SMALL)
    with pytest.warns(UserWarning, match="1 of 8 videos left out"):
        assert len(opensora.from_table(bad, root=folder, bucket_config=SMALL, on_error="skip")) == 7


def test_bad_input_is_named(files, tmp_path):
    _, paths, captions = files
    with pytest.raises(ValueError, match="2 captions for 8 videos"):
        opensora.clips(paths, captions[:2], bucket_config=SMALL)
    with pytest.raises(ValueError, match="pass neither batch_size= nor batch_tokens="):
        Loader(opensora.clips(paths[:2], bucket_config=SMALL), batch_size=2)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(open(paths[1], "rb").read()[:2000])
    with pytest.raises(ValueError, match=r"cut\.mp4: cannot read it"):
        opensora.clips([paths[0], str(cut)], bucket_config=SMALL)
    with pytest.warns(UserWarning, match="1 of 3 videos left out"):
        v = opensora.clips([paths[0], str(cut), paths[2]], ["a", "b", "c"], bucket_config=SMALL, on_error="skip")
    assert [s[0] for s in v.skipped] == [1] and v.positions.tolist() == [0, 2]
    with Loader(v, seed=0, workers=1) as loader:
        got = {i: c for b in loader for i, c in zip(b["index"].tolist(), b["caption"].tolist())}
    assert got == {0: "a", 2: "c"}  # each video keeps its place and caption


def test_an_evaluation_pass_keeps_every_video_in_its_largest_bucket(files, tmp_path):
    """eval_loader: each length kept with certainty (the 0.5 chance of 96px and its skip to a shorter
    length are not drawn), frames from the middle of the window's range; the videos no bucket holds
    listed by position and path; a still image takes a one-frame bucket."""
    from PIL import Image

    from shmloader import eval_loader

    folder, paths, captions = files
    still = tmp_path / "still.png"
    Image.fromarray(np.full((96, 128, 3), 200, np.uint8)).save(still)
    v = opensora.clips([*paths, str(still)], [*captions, "a still"], bucket_config={**SMALL, "64px": {**SMALL["64px"], 1: (1.0, 4)}})
    assert v.left_out(0, 0) == [(7, paths[7])]  # 40x48: under every bucket's pixels
    evaluation = v.for_eval()
    assert evaluation.fingerprint() != v.fingerprint()
    ids = evaluation.assign(0, 0)
    assert [evaluation.table.names[k].split()[:2] for k in ids[:5]] == [["96px", "17x96x96"]] * 5
    assert evaluation.table.names[ids[8]].startswith("64px 1x")
    with eval_loader(v, workers=1) as loader:
        got, seen = {}, []
        for b in loader:
            for i, frames, caption in zip(b["index"].tolist(), b["frames"], b["caption"].tolist()):
                got[i] = (frames.tolist(), caption)
                seen.append(i)
    assert sorted(seen) == [0, 1, 2, 3, 4, 5, 6, 8] and got[8] == ([0], "a still")  # each once: no padding
    # 17 frames every 2nd of 40: the window of 34 starts at the middle of [0, 5]
    assert got[0][0] == np.linspace(2, 35, 17).astype(int).tolist()


def test_an_epoch_no_batch_holds_is_passed_over_not_the_end_of_the_run(files):
    """Each epoch draws its buckets: with a chance of 0.5 and drop_remainder=True an epoch may hold
    no whole batch; the run goes on to the next epochs, and len(loader) follows each epoch's count."""
    _, paths, _ = files
    v = opensora.clips(paths[:5], bucket_config={"96px": {17: (0.5, 3)}})

    def counts(seed: int) -> list[int]:
        return [len(bucket_plan(v.assign(seed, e), v.table.batch_sizes, seed=seed, epoch=e, shuffle=True,
                                drop_remainder=True, shard=(0, 1))[1]) - 1 for e in range(6)]

    seed = next(s for s in range(200) if 0 in counts(s)[1:5] and counts(s)[0] and counts(s)[5])
    want = counts(seed)
    with Loader(v, shuffle=True, seed=seed, epochs=6, workers=1, drop_remainder=True) as loader:
        assert len(loader) == want[0]
        assert sum(1 for _ in loader) == sum(want)
    with Loader(v, shuffle=True, seed=seed, epochs=1, workers=1, drop_remainder=True) as loader:
        for epoch in range(3):
            assert len(loader) == want[epoch] and sum(1 for _ in loader) == want[epoch]
