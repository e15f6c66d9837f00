"""A variable number of frames (``fps=F, max_frames=M``, no ``clip_len``): the frame on screen at
every ``1/F`` seconds of the video, evenly thinned to ``M`` when there are more; ``video``
``[M, H, W, 3]`` zero-padded, ``mask`` True on the frames that came, ``frames`` -1 on padding.
Checked against a sequential libavformat decode's frame times, with both decoders, on videos of
several lengths and frame rates and a variable-rate one; the fields reach torch, JAX and tf.data."""

from __future__ import annotations

import numpy as np
import pytest

import shmloader
from shmloader.video.samples import read_codes

from ._variants import frame_times
from .conftest import state_after

pytestmark = pytest.mark.timeout(180)

F, M = 5.0, 8


def samples_of(clips, workers=2, batch_size=2, **kw):
    with shmloader.Loader(clips, batch_size=batch_size, workers=workers, timeout=60, **kw) as loader:
        out = [{k: np.array(v[i]) for k, v in b.items()} for b in loader for i in range(len(b["index"]))]
        return out, loader.stats()


def expected(times, fps=F, cap=M, phase=0.0):
    """The rule, from the frame times of a sequential decode."""
    count = int(np.ceil((times[-1, 1] - phase) * fps - 1e-9))
    k = np.arange(count)
    if count > cap:
        k = np.round(np.linspace(0, count - 1, cap)).astype(int)
    return np.searchsorted(times[:, 0], phase + k / fps + 1e-6, side="right") - 1


def check_padding(s, n, vid):
    assert s["video"].shape == (M, 48, 64, 3) and s["frames"].shape == (M,) and s["mask"].shape == (M,)
    assert s["mask"].dtype == np.bool_ and list(s["mask"]) == [True] * n + [False] * (M - n)
    assert (s["frames"][n:] == -1).all() and (s["frames"][:n] >= 0).all()
    assert not s["video"][n:].any()  # zeros, whatever the slot held before
    ids, numbers = read_codes(s["video"][:n])
    assert (ids == vid).all() and list(numbers) == list(s["frames"][:n])
    assert int(s["start"]) == s["frames"][0]


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_every_frame_at_fps_up_to_the_cap(timed_videos, decoder):
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, fps=F, max_frames=M, sampling="uniform", size=(48, 64), decoder=decoder)
    assert clips.sampling.length == M and clips.spec()["video"][0] == (M, 48, 64, 3)
    # One sample a batch through 3 slots: shorter samples land in slots that held longer ones.
    got, _ = samples_of(clips, workers=1, batch_size=1, slots=3, epochs=2)
    counts = {}
    for s in got:
        path, vid = timed_videos[int(s["index"])]
        want = expected(frame_times(path))
        n = len(want)
        counts[path] = n
        np.testing.assert_array_equal(s["frames"][:n], want, err_msg=path)
        check_padding(s, n, vid)
    # 2.4 s (12 instants, thinned), 0.74 s (4), 1.3 s (7), 2.33 s variable rate (12, thinned)
    assert sorted(counts.values()) == [4, 7, 8, 8]


@pytest.mark.parametrize("decoder", ["auto", "pyav"])
def test_training_draws_a_seeded_phase(timed_videos, decoder):
    """``sampling="random"``: the instants start at a seeded phase within the first 1/F s, new
    each epoch, the same whatever the worker count."""
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, fps=F, max_frames=M, size=(48, 64), decoder=decoder)
    one, _ = samples_of(clips, workers=1, shuffle=True, seed=3, epochs=3)
    three, _ = samples_of(clips, workers=3, shuffle=True, seed=3, epochs=3)
    for a, b in zip(one, three):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    draws = {}
    for s in one:
        path, vid = timed_videos[int(s["index"])]
        times = frame_times(path)
        n = int(s["mask"].sum())
        f = s["frames"][:n]
        # Some phase in [0, 1/F) puts every delivered frame on screen at its instant.
        assert any(np.array_equal(expected(times, phase=p), f) for p in np.linspace(0, 1 / F, 400, endpoint=False)), \
            (path, f)
        check_padding(s, n, vid)
        draws.setdefault(path, set()).add(tuple(f))
    assert sum(len(d) > 1 for d in draws.values()) >= 2  # phases differ across epochs


def test_resume_gives_the_same_frames(timed_videos):
    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, fps=F, max_frames=M, size=(48, 64))
    kw = dict(batch_size=1, workers=2, shuffle=True, seed=4, epochs=2)
    with shmloader.Loader(clips, **kw) as loader:
        full = [(np.array(b["frames"]), np.array(b["mask"])) for b in loader]
    _, state = state_after(clips, 3, **kw)
    with shmloader.Loader(clips, state=state, **kw) as loader:
        rest = [(np.array(b["frames"]), np.array(b["mask"])) for b in loader]
    assert len(rest) == len(full) - 3
    for (a, am), (b, bm) in zip(full[3:], rest):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(am, bm)


def test_torch_jax_and_tf_keep_the_mask_and_frames(timed_videos):
    import jax
    import tensorflow as tf
    import torch

    import shmloader.jax

    paths = [p for p, _ in timed_videos]
    clips = shmloader.VideoClips(paths, fps=F, max_frames=M, sampling="uniform", size=(48, 64))
    want = {int(s["index"]): s for s in samples_of(clips, batch_size=4)[0]}
    with shmloader.Loader(clips, batch_size=4, workers=2) as loader:
        (t,) = list(loader.as_torch())
        assert t["mask"].dtype == torch.bool and tuple(t["mask"].shape) == (4, M)
        (j,) = list(shmloader.jax.batches(loader))
        assert j["mask"].dtype == jax.numpy.bool_
        ds = loader.as_dataset()
        assert ds.element_spec["mask"].dtype == tf.bool and ds.element_spec["frames"].shape[1:] == (M,)
        (d,) = [{k: v.numpy() for k, v in b.items()} for b in ds]
        for got in ({k: v.numpy() for k, v in t.items()}, {k: np.asarray(v) for k, v in j.items()}, d):
            for i, v in enumerate(got["index"]):
                for key in ("mask", "frames", "video"):
                    np.testing.assert_array_equal(got[key][i], want[int(v)][key])


@pytest.mark.parametrize("kw, name", [(dict(), "fps"), (dict(fps=2, clip_len=8), "clip_len"),
                                      (dict(fps=2, clips_per_sample=2), "clips_per_sample"),
                                      (dict(fps=2, max_frames=0), "max_frames")])
def test_bad_max_frames_arguments(timed_videos, kw, name):
    with pytest.raises(ValueError, match=name):
        shmloader.VideoClips([timed_videos[0][0]], **{"max_frames": M, **kw})


def test_the_docs_video_llm_recipe(timed_videos):
    from ._examples import doc_example

    paths = [p for p, _ in timed_videos]
    namespace = {"shmloader": shmloader, "paths": paths}
    exec(doc_example("video-llm"), namespace)
    mask, frames = np.array(namespace["mask"]), np.array(namespace["frames"])
    assert namespace["video"].shape == (4, 64, 224, 224, 3) and mask.shape == (4, 64)
    # 2 fps: 5 frames of the 2.4 s video, 2 of the 0.74 s one, 3 of the 1.3 s one, 5 of the 2.33 s one
    assert mask.sum(axis=1).tolist() == [5, 2, 3, 5]
    assert (frames[~mask] == -1).all() and (frames[mask] >= 0).all()
    del namespace
