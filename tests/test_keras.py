"""Keras 3: ``loader.as_keras()`` trains with ``fit`` on the tensorflow, jax and torch backends,
each in its own interpreter (Keras picks its backend once, at import)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import shmloader

from ._examples import doc_example, run_child
from ._sound import FPS, RATE, write_av

pytestmark = pytest.mark.timeout(240)

FIT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import shmloader
    from shmloader._keras import KerasDataset
    from shmloader.video.samples import read_codes

    # What Keras asks each dataset for, probes included, and when: ["begin"], ["end"], or the
    # (video, clip start) pairs of a batch, read from the frame codes of the pixels Keras got.
    events = {}
    def log(self, event):
        events.setdefault(id(self.loader), []).append(event)
    getitem, begin, end = KerasDataset.__getitem__, KerasDataset.on_epoch_begin, KerasDataset.on_epoch_end
    def logged_getitem(self, index):
        batch = getitem(self, index)
        ids, frames = read_codes(np.asarray(batch[0]))
        log(self, [[int(i), int(f)] for i, f in zip(ids[:, 0], frames[:, 0])])
        return batch
    def logged_begin(self):
        log(self, "begin")
        begin(self)
    def logged_end(self):
        log(self, "end")
        end(self)
    KerasDataset.__getitem__ = logged_getitem
    KerasDataset.on_epoch_begin, KerasDataset.on_epoch_end = logged_begin, logged_end

    def stream(loader, passes=1):
        out = []
        for _ in range(passes):
            for b in loader:
                out.append([[int(i), int(s)] for i, s in zip(b["index"], b["start"])])
        return out

    paths = json.loads(sys.argv[1])
    labels = [i % 3 for i in range(len(paths))]
    clips = shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))
    namespace = {"paths": paths, "labels": labels, "clips": clips, "shmloader": shmloader}
    exec(sys.argv[2], namespace)
    train, val, history, model = namespace["train"], namespace["val"], namespace["history"].history, namespace["model"]
    import keras
    out = {"backend": keras.backend.backend(), "loss": history["loss"], "val_loss": history["val_loss"],
           "train_batches": train.stats()["batches"], "val_batches": val.stats()["batches"],
           "train_len": len(train), "val_len": len(val),
           "train_events": events.pop(id(train)), "val_events": events.pop(id(val))}
    with shmloader.Loader(clips, batch_size=4, shuffle=True, seed=0, epochs=2) as plain:
        out["train_stream"] = stream(plain)  # what the example's two Keras epochs must have trained
    with shmloader.eval_loader(clips, batch_size=4) as plain:
        out["val_stream"] = stream(plain)
        x = np.concatenate([b["video"] for b in plain])
    out["expected_predictions"] = keras.ops.convert_to_numpy(model(x)).tolist()  # the same model, all clips in order

    # predict and a standalone evaluate, each on a fresh evaluation loader
    with shmloader.eval_loader(clips, batch_size=4) as ev:
        out["predictions"] = np.asarray(model.predict(ev.as_keras(y=None), verbose=0)).tolist()
        out["predict_batches"], out["predict_events"] = ev.stats()["batches"], events.pop(id(ev))
    with shmloader.eval_loader(clips, batch_size=4) as ev:
        out["evaluate_loss"] = float(model.evaluate(ev.as_keras(), verbose=0))
        out["evaluate_batches"], out["evaluate_events"] = ev.stats()["batches"], events.pop(id(ev))
    logits = np.asarray(out["expected_predictions"])
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(1, keepdims=True)
    out["expected_loss"] = float(-logp[np.arange(len(labels)), labels].mean())
    print(json.dumps(out))
""")


def windows(events):
    """Split what a dataset served into (inside an epoch?, [batches]) runs, in order."""
    out, inside, current = [], False, []
    for e in events:
        if e in ("begin", "end"):
            if current:
                out.append((inside, current))
            inside, current = e == "begin", []
        else:
            current.append(e)
    if current:
        out.append((inside, current))
    return out


def trained(events, n):
    """The epochs Keras ran through: windows of exactly ``n`` batches (a probe takes fewer)."""
    return [w for inside, w in windows(events) if inside and len(w) == n]


OLD_KERAS = textwrap.dedent("""
    import json, sys
    import shmloader
    paths = json.loads(sys.argv[1])
    clips = shmloader.VideoClips(paths, [i % 3 for i in range(len(paths))], clip_len=8, size=(64, 64))
    with shmloader.Loader(clips, batch_size=4) as loader:
        try:
            loader.as_keras()
        except ImportError as e:
            print(json.dumps(str(e)))
""")


def keras_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("keras").split(".")[:2])


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_fit_predict_evaluate_on_each_backend(videos, backend):
    paths, _ = videos
    example = doc_example("keras-fit").replace("epochs=2)", "epochs=2, verbose=0)")
    if backend == "jax" and keras_version() < (3, 15):  # the oldest lane's Keras: refused, in words
        assert "on the jax backend needs Keras 3.15 or newer" in run_child(OLD_KERAS, json.dumps(paths),
                                                                           env={"KERAS_BACKEND": "jax"})
        return
    r = run_child(FIT, json.dumps(paths), example, env={"KERAS_BACKEND": backend})
    assert r["backend"] == backend
    assert len(r["loss"]) == len(r["val_loss"]) == 2 and np.isfinite(r["loss"] + r["val_loss"]).all()
    # Each Keras epoch took one loader epoch, and the batches Keras probed before training were
    # served again rather than lost: the loaders delivered exactly what the epochs hold.
    assert r["train_batches"] == 2 * r["train_len"] and r["val_batches"] == 2 * r["val_len"]
    n = r["train_len"]
    assert sum(len(w) for _, w in windows(r["train_events"])) > 2 * n  # Keras did probe
    # The two epochs Keras trained are the loader's two epochs, in order: each has every video
    # once, and they differ (another order, other clip starts).
    epochs = trained(r["train_events"], n)
    assert len(epochs) == 2 and epochs[0] + epochs[1] == r["train_stream"]
    for e in epochs:
        assert sorted(v for batch in e for v, _ in batch) == list(range(len(paths)))
    assert epochs[0] != epochs[1]
    # Validation: the whole evaluation pass, the same every epoch.
    assert trained(r["val_events"], r["val_len"]) == [r["val_stream"]] * 2
    # predict and a standalone evaluate: one pass each, every clip once, in order.
    assert r["predict_batches"] == r["evaluate_batches"] == r["val_len"]
    assert trained(r["predict_events"], r["val_len"]) == [r["val_stream"]]
    assert trained(r["evaluate_events"], r["val_len"]) == [r["val_stream"]]
    assert np.allclose(r["predictions"], r["expected_predictions"], atol=1e-4)
    assert r["evaluate_loss"] == pytest.approx(r["expected_loss"], rel=1e-4, abs=1e-5)


def test_batches_are_the_loaders_views_and_fields_are_chosen(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=2, workers=1) as loader:
        with pytest.raises(ValueError, match="no field 'clip'"):
            loader.as_keras(x="clip")
        ds = loader.as_keras(x=["video", "frames"], y=None)
        assert len(ds) == 4
        (x,) = ds[0]
        assert set(x) == {"video", "frames"} and x["video"].shape == (2, 4, 32, 40, 3)
        assert loader._ring.contains(x["video"].ctypes.data)  # no copy on the way to Keras
        x2, y2 = loader.as_keras()[1]
        assert x2.shape == (2, 4, 32, 40, 3) and y2.tolist() == [labels[2], labels[3]]


def test_audio_goes_to_keras_as_inputs_of_each_clips_samples(tmp_path):
    """``x=["video", "audio", "audio_len"]``: a Keras batch's inputs are the loader's views,
    the sound of each clip as the reader gives it."""
    path = write_av(tmp_path / "tone.mov", "pcm_s16le")
    clips = shmloader.VideoClips([path], [1], clip_len=4, clips_per_video=4, sampling="uniform",
                                 audio_rate=RATE, audio_channels=2)
    n = round(4 / FPS * RATE)
    want = clips.reader().read(range(4))
    with shmloader.Loader(clips, batch_size=2, workers=1, timeout=60) as loader:
        ds = loader.as_keras(x=["video", "audio", "audio_len"])
        assert len(ds) == 2
        for i in range(2):
            x, y = ds[i]
            assert x["audio"].dtype == np.float32 and x["audio"].shape == (2, n, 2)
            assert x["audio_len"].dtype == np.int32 and x["audio_len"].tolist() == [n, n]
            assert loader._ring.contains(x["audio"].ctypes.data)
            np.testing.assert_allclose(x["audio"], want["audio"][2 * i : 2 * i + 2], atol=1e-4)
            assert y.tolist() == [1, 1] and np.abs(x["audio"]).max() > 0.02
            del x, y


def test_import_error_names_the_extra():
    script = textwrap.dedent("""
        import json, sys
        sys.modules["keras"] = None  # as if Keras were not installed
        import numpy as np
        import shmloader
        src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(1)}, {"x": ((1,), np.float64)}, 2)
        with shmloader.Loader(src, batch_size=2, workers=1) as loader:
            try:
                loader.as_keras(x="x", y=None)
            except ImportError as e:
                print(json.dumps(str(e)))
    """)
    assert "pip install './shmloader[keras]'" in run_child(script)
