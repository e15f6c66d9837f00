"""tf.data: zero-copy delivery, the lease rule through prefetch, Keras, and lean workers.

This module imports TensorFlow at the top, as nearly every training script does.
"""

from __future__ import annotations

import gc
import json
import textwrap

import numpy as np
import psutil
import pytest
import tensorflow as tf

import shmloader
from shmloader.video.samples import read_codes

from ._examples import run_child
from ._sound import FPS, RATE, write_av
from .conftest import our_mappings


def check_batch(video, index, start, frame_step=1):
    ids, frames = read_codes(video)
    assert (ids == index[:, None]).all()
    assert (frames == start[:, None] + frame_step * np.arange(frames.shape[1])).all()


def test_element_spec(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(40, 56))
    with shmloader.Loader(clips, batch_size=3, workers=1) as loader:
        spec = loader.as_dataset().element_spec
        assert spec["video"] == tf.TensorSpec((None, 4, 40, 56, 3), tf.uint8, name="video")
        assert spec["label"].shape.as_list() == [None] and spec["label"].dtype == tf.int64
        assert set(spec) == {"video", "label", "index", "start", "frames", "times"}
        assert spec["frames"] == tf.TensorSpec((None, 4), tf.int64, name="frames")
    with shmloader.Loader(clips, batch_size=3, workers=1, drop_remainder=True) as loader:
        assert loader.as_dataset().element_spec["video"].shape.as_list() == [3, 4, 40, 56, 3]


def test_audio_elements_carry_each_clips_samples(tmp_path):
    """``audio`` float32 ``[B, S, C]`` and ``audio_len`` int32 ``[B]`` in the element spec and
    in every element, holding what the reader gives for the same samples."""
    import shmloader.tfdata

    path = write_av(tmp_path / "tone.mov", "pcm_s16le")
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=5, sampling="uniform", audio_rate=RATE,
                                 audio_channels=2)
    n = round(4 / FPS * RATE)
    want = clips.reader().read(range(5))
    with shmloader.Loader(clips, batch_size=2, workers=1, timeout=60) as loader:
        ds = shmloader.tfdata.as_dataset(loader)
        assert ds.element_spec["audio"] == tf.TensorSpec((None, n, 2), tf.float32, name="audio")
        assert ds.element_spec["audio_len"] == tf.TensorSpec((None,), tf.int32, name="audio_len")
        got = [{k: e[k].numpy().copy() for k in ("start", "audio", "audio_len")} for e in ds]
    assert [len(e["start"]) for e in got] == [2, 2, 1]
    np.testing.assert_array_equal(np.concatenate([e["start"] for e in got]), want["start"])
    np.testing.assert_array_equal(np.concatenate([e["audio_len"] for e in got]), want["audio_len"])
    np.testing.assert_allclose(np.concatenate([e["audio"] for e in got]), want["audio"], atol=1e-4)
    assert (want["audio_len"] == n).all() and np.abs(want["audio"]).max() > 0.02


def slot_of(loader, video: np.ndarray, index: np.ndarray) -> int:
    matches = [s for s, views in enumerate(loader._ring.slot_views)
               if np.array_equal(views["video"][: len(video)], video) and np.array_equal(views["index"][: len(index)], index)]
    assert len(matches) == 1
    return matches[0]


def test_dataset_tensors_alias_the_ring(videos):
    """A write into the ring shows through a tensor already delivered: TF did not copy the slot.

    (``Tensor.numpy()`` itself copies memory TF does not own, so aliasing is shown by behaviour.)
    """
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=1, workers=2, epochs=1) as loader:  # every batch distinct
        n = 0
        for batch in loader.as_dataset(prefetch=2):
            video, index = batch["video"].numpy(), batch["index"].numpy()
            check_batch(video, index, batch["start"].numpy())
            ring_video = loader._ring.slot_views[slot_of(loader, video, index)]["video"]
            ring_video[0, 0, 0, 0, 0] ^= 0xFF
            assert batch["video"].numpy()[0, 0, 0, 0, 0] == video[0, 0, 0, 0, 0] ^ 0xFF
            ring_video[0, 0, 0, 0, 0] ^= 0xFF
            n += 1
        assert n == 8
        assert loader.stats()["copied"] == 0
        assert len(our_mappings()) == 1  # one ring for every batch


# The loader's warning that the consumer holds most of a small ring (then copies) is what this
# test's tiny ring makes happen; the test checks the batches, the warning is expected here.
@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
def test_batch_held_through_prefetch_never_changes(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=4, shuffle=True, epochs=5) as loader:
        it = iter(loader.as_dataset(prefetch=tf.data.AUTOTUNE))
        held = next(it)
        snapshot = held["video"].numpy().copy()
        n = sum(1 for _ in it)
        assert n == 5 * 4 - 1
        np.testing.assert_array_equal(held["video"].numpy(), snapshot)
        check_batch(held["video"].numpy(), held["index"].numpy(), held["start"].numpy())
        del it, held


# The loader's warning that the consumer holds most of a small ring (then copies) is what this
# test's tiny ring makes happen; the test checks the batches, the warning is expected here.
@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
def test_take_100_with_small_ring(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=3, shuffle=True, epochs=None) as loader:
        kept, received = [], []
        for b in loader.as_dataset().take(100):
            kept.append(b)
            received.append((b["index"].numpy().copy(), b["start"].numpy().copy()))  # what arrived
        assert len(kept) == 100
        # Every kept batch still holds the clips it arrived with: a slot written again after it
        # was handed out would show other videos or frames here.
        for b, (index, start) in zip(kept, received):
            check_batch(b["video"].numpy(), index, start)
            assert (b["index"].numpy() == index).all() and (b["start"].numpy() == start).all()
        epochs = [sorted(int(i) for idx, _ in received[4 * e : 4 * e + 4] for i in idx) for e in range(25)]
        assert all(e == list(range(8)) for e in epochs)  # 4 batches of 2 per epoch, each clip once
        stats = loader.stats()
        assert stats["leased"] <= 2 and stats["copied"] >= 98 - stats["leased"]
        del kept, b
    gc.collect()


def test_sample_error_through_as_dataset_is_unknown_error_with_our_message():
    def fn(i, rng):
        if i == 3:
            raise ValueError("row 3 is damaged")
        return {"x": np.int64(i)}

    src = shmloader.FunctionSource(fn, {"x": ((), np.int64)}, 8, check=False)
    with shmloader.Loader(src, batch_size=2, workers=1) as loader:
        with pytest.raises(tf.errors.UnknownError, match=r"SampleError: sample 3 \(index 3 of .*fn\): "
                                                         r"ValueError: row 3 is damaged"):
            for _ in loader.as_dataset():
                pass


def tiny_model():
    model = tf.keras.Sequential([
        tf.keras.Input((4, 32, 40, 3)),
        tf.keras.layers.Conv3D(4, 3, activation="relu"),
        tf.keras.layers.GlobalAveragePooling3D(),
        tf.keras.layers.Dense(3),
    ])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def xy(batch):
    return tf.cast(batch["video"], tf.float32) / 255.0, batch["label"]


# Keras learns the size of a dataset from_generator gives (no cardinality) when its first epoch
# runs out, and says so in these words: this test wants exactly that, a pass of the loader per
# Keras epoch, without steps_per_epoch.
@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
def test_keras_fit_conv3d_with_validation(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=4, workers=1, shuffle=True, epochs=1, drop_remainder=True) as train, \
            shmloader.eval_loader(clips, batch_size=3) as val:
        history = tiny_model().fit(train.as_dataset().map(xy), validation_data=val.as_dataset().map(xy),
                                   epochs=3, verbose=0, shuffle=False)  # the loader shuffles
        assert len(history.history["loss"]) == 3 and np.isfinite(history.history["loss"]).all()
        assert len(history.history["val_loss"]) == 3  # a full validation pass every epoch
        assert train.stats()["batches"] == 3 * len(train)  # one pass of the loader per Keras epoch
        assert val.stats()["samples"] == 3 * len(paths)


def test_keras_checkpoint_callback_resumes_exactly(videos, tmp_path):
    import json

    from shmloader.tfdata import LoaderCheckpoint

    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(32, 40))
    kw = dict(batch_size=2, workers=1, shuffle=True, seed=4, epochs=3)
    with shmloader.Loader(clips, **kw) as loader:
        expected = [b["index"].tolist() + b["start"].tolist() for b in loader]
    state_file = tmp_path / "loader.json"
    with shmloader.Loader(clips, **kw) as loader:
        tiny_model().fit(loader.as_dataset(prefetch=3).map(xy), epochs=1, steps_per_epoch=len(loader), verbose=0,
                         shuffle=False, callbacks=[LoaderCheckpoint(loader, str(state_file))])
        # prefetch runs ahead of training where the machine lets it (not always on a busy one):
        # the state counts the batches Keras trained on either way
        assert loader.stats()["batches"] >= len(loader)
    state = json.loads(state_file.read_text())
    assert (state["epoch"], state["batch"]) == (1, 0)
    with shmloader.Loader(clips, **kw, state=state) as loader:
        assert [b["index"].tolist() + b["start"].tolist() for b in loader] == expected[len(loader):]


# A training script without TensorFlow: its workers' private memory after the first batch.
LEAN_WORKERS = textwrap.dedent("""
    import json, sys
    import psutil
    import shmloader

    def transform(sample, rng):
        sample["video"][:] = sample["video"][:, :, ::-1]
        sample["label"][...] = 7

    clips = shmloader.VideoClips(json.loads(sys.argv[1]), clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, transform=transform) as loader:
        it = iter(loader)
        next(it)
        uss = [psutil.Process(p).memory_full_info().uss for p in loader.worker_pids()]
        assert "tensorflow" not in sys.modules
        del it
    print(json.dumps(uss))
""")
# Private memory a worker of a TensorFlow script may take beyond one of a script without it. A
# worker that imported TensorFlow would carry ~400 MiB more; measured here:
# 27-28 MiB in this TensorFlow process against 32 MiB without it.
_LEAN_MARGIN_MIB = 64


def test_workers_stay_lean_and_run_local_transform(videos):
    """TF imported here; workers must not import it, and a closure defined here must run there.
    Lean: their private memory (USS) is what a worker of a script without TensorFlow takes."""
    paths, _ = videos
    flip_marker = 7

    def transform(sample, rng):  # not importable by name: sent by value
        sample["video"][:] = sample["video"][:, :, ::-1]
        sample["label"][...] = flip_marker

    lean = max(run_child(LEAN_WORKERS, json.dumps(paths)))
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, transform=transform) as loader:
        it = iter(loader)
        b = next(it)
        assert (b["label"] == flip_marker).all()
        check_batch(b["video"][:, :, :, ::-1], b["index"], b["start"])
        for pid in loader.worker_pids():
            proc = psutil.Process(pid)
            uss = proc.memory_full_info().uss
            assert uss < lean + (_LEAN_MARGIN_MIB << 20), \
                f"worker {pid}: {uss / 2**20:.0f} MiB private, {lean / 2**20:.0f} MiB without TensorFlow"
            assert not [m.path for m in proc.memory_maps() if "tensorflow" in m.path.lower()]
        del b, it


@pytest.mark.parametrize("how", ["import shmloader.tfdata", "loader.as_dataset()"])
def test_import_error_names_the_extra(how):
    """Without TensorFlow, both ways in name the extra to install, as the other adapters do."""
    script = textwrap.dedent("""
        import json, sys
        sys.modules["tensorflow"] = None  # as if TensorFlow were not installed
        import numpy as np
        import shmloader
        src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(1)}, {"x": ((1,), np.float64)}, 2)
        try:
            if sys.argv[1] == "import shmloader.tfdata":
                import shmloader.tfdata
            else:
                with shmloader.Loader(src, batch_size=2, workers=1) as loader:
                    loader.as_dataset()
        except ImportError as e:
            print(json.dumps(str(e)))
    """)
    message = run_child(script, how)
    assert "pip install './shmloader[tf]'" in message and "TensorFlow" in message, message
