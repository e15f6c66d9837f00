"""transform(sample, rng): in place or a new dict, checked at construction, reproducible per sample."""

from __future__ import annotations

import numpy as np
import pytest

import shmloader

pytestmark = pytest.mark.timeout(60)

SPEC = {"i": ((), np.int64), "x": ((6,), np.float64)}


def ident(index, rng):
    return {"i": np.int64(index), "x": np.zeros(6)}


def noise(sample, rng):  # in place, from the sample's own generator
    sample["x"][:] = rng.normal(size=6)


def by_sample(seed, workers, epochs=2, transform=noise):
    """{(epoch, sample): x} over a shuffled run."""
    src = shmloader.FunctionSource(ident, SPEC, 20)
    out = {}
    with shmloader.Loader(src, batch_size=3, workers=workers, shuffle=True, seed=seed, epochs=epochs,
                          transform=transform) as loader:
        for n, b in enumerate(loader):
            epoch = n // len(loader)
            for i, x in zip(b["i"], b["x"]):
                out[(epoch, int(i))] = x.copy()
    return out


def test_transform_rng_reproducible_whatever_the_worker_count():
    one, three = by_sample(seed=5, workers=1), by_sample(seed=5, workers=3)
    assert one.keys() == three.keys() and len(one) == 40
    for key in one:
        np.testing.assert_array_equal(one[key], three[key])
    other_seed = by_sample(seed=6, workers=1)
    assert not any(np.array_equal(one[k], other_seed[k]) for k in one)
    assert not any(np.array_equal(one[(0, s)], one[(1, s)]) for s in range(20))  # new draws each epoch
    assert len({one[k].tobytes() for k in one}) == 40  # one generator per sample


def test_transform_returning_a_new_dict_sets_the_batch_layout(videos):
    """Crop and normalise to float: shapes and dtypes learnt from one call on a zero sample."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(48, 64))

    def crop_to_float(sample, rng):
        return {"video": sample["video"][:, 8:40, 16:48].astype(np.float32) / 255,
                "label": sample["label"], "index": sample["index"], "start": sample["start"]}

    kw = dict(batch_size=3, workers=2, shuffle=True, seed=1)
    with shmloader.Loader(clips, **kw) as plain:
        raw = [{k: v.copy() for k, v in b.items()} for b in plain]
    with shmloader.Loader(clips, transform=crop_to_float, **kw) as loader:
        assert loader.element_spec["video"] == ((None, 4, 32, 32, 3), np.dtype(np.float32))
        got = [{k: v.copy() for k, v in b.items()} for b in loader]
    assert len(got) == len(raw) == 3
    for b, r in zip(got, raw):
        assert (b["start"] == r["start"]).all() and (b["index"] == r["index"]).all()  # same clips
        np.testing.assert_allclose(b["video"], r["video"][:, :, 8:40, 16:48].astype(np.float32) / 255, rtol=1e-6)


def test_transform_failing_on_a_zero_sample_fails_at_construction():
    def needs_nonzero(sample, rng):
        return {"x": sample["x"] / sample["x"].sum(), "i": sample["i"]} if sample["x"].sum() else 1 / 0

    src = shmloader.FunctionSource(ident, SPEC, 4)
    with pytest.raises(ValueError, match="transform failed on a zero-filled sample: ZeroDivisionError"):
        shmloader.Loader(src, batch_size=2, transform=needs_nonzero)
    with pytest.raises(TypeError, match="returned list"):
        shmloader.Loader(src, batch_size=2, transform=lambda sample, rng: [sample])
