"""Keras 3: ``loader.as_keras()`` trains with ``fit`` on the tensorflow, jax and torch backends,
each in its own interpreter (Keras picks its backend once, at import)."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import shmloader

from ._examples import readme_example, run_child

pytestmark = pytest.mark.timeout(240)

FIT = textwrap.dedent("""
    import json, sys
    import shmloader
    from shmloader._keras import KerasDataset

    calls = []
    getitem = KerasDataset.__getitem__
    def counting(self, index):  # what Keras asks for, probes included
        calls.append(index)
        return getitem(self, index)
    KerasDataset.__getitem__ = counting

    paths = json.loads(sys.argv[1])
    labels = [i % 3 for i in range(len(paths))]
    clips = shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))
    namespace = {"paths": paths, "labels": labels, "clips": clips, "shmloader": shmloader}
    exec(sys.argv[2], namespace)
    train, val, history = namespace["train"], namespace["val"], namespace["history"].history
    import keras
    print(json.dumps({"backend": keras.backend.backend(), "loss": history["loss"], "val_loss": history["val_loss"],
                      "train_batches": train.stats()["batches"], "val_batches": val.stats()["batches"],
                      "train_len": len(train), "val_len": len(val), "calls": len(calls)}))
""")


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_fit_on_each_backend(videos, backend):
    paths, _ = videos
    example = readme_example("keras-fit").replace("epochs=2)", "epochs=2, verbose=0)")
    r = run_child(FIT, json.dumps(paths), example, env={"KERAS_BACKEND": backend})
    assert r["backend"] == backend
    assert len(r["loss"]) == len(r["val_loss"]) == 2 and np.isfinite(r["loss"] + r["val_loss"]).all()
    # Each Keras epoch took one loader epoch, and the batches Keras probed before training were
    # served again rather than lost: the loaders delivered exactly what the epochs hold.
    assert r["train_batches"] == 2 * r["train_len"] and r["val_batches"] == 2 * r["val_len"]
    assert r["calls"] > 2 * (r["train_len"] + r["val_len"])  # Keras did probe


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
    assert "pip install 'shmloader[keras]'" in run_child(script)
