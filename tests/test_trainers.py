"""Resuming through the programs that consume the loader: the recipes of the "Training loops" page
(PyTorch Lightning, Hugging Face Accelerate, a plain loop, Keras ``fit(initial_epoch=)``), each
stopped part-way, resumed in a fresh process and checked against the run that was never stopped.
The loader makes one pass per epoch (``epochs=1``), as trainers iterate it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmloader
from shmloader.samples import read_codes

from ._examples import ROOT, doc_example
from ._needs import need

EPOCHS, BATCH, STOP = 3, 4, 6  # 16 clips: 4 batches an epoch; step 6 is batch 2 of epoch 1

# What each recipe's child knows beforehand: the clips of the page's first block over the test's
# videos, and codes(batch): [video id, first frame] of each sample, read off the decoded pixels.
PRELUDE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import shmloader
    from shmloader.samples import read_codes

    paths = json.loads(sys.argv[1])
    clips = shmloader.VideoClips(paths, [i % 3 for i in range(len(paths))], clip_len=4,
                                 clips_per_video=2, size=(64, 64))
    seen = []

    def codes(batch):
        ids, frames = read_codes(np.asarray(batch["video"]))
        return np.stack([ids[:, 0], frames[:, 0]], axis=1).tolist()

""")


# The first line of the torch recipes' training step: where their child records each batch.
TORCH_STEP = 'x = batch["video"].float().mean(dim=(1, 2, 3))'


def straight_run(paths) -> list:
    """The batches of the run that is never stopped, as codes: the loader iterated once per epoch."""
    clips = shmloader.VideoClips(paths, [i % 3 for i in range(len(paths))], clip_len=4, clips_per_video=2,
                                 size=(64, 64))
    out = []
    with shmloader.Loader(clips, batch_size=BATCH, shuffle=True, seed=0, epochs=1) as loader:
        for _ in range(EPOCHS):
            for batch in loader:
                ids, frames = read_codes(batch["video"])
                out.append(np.stack([ids[:, 0], frames[:, 0]], axis=1).tolist())
    assert len(out) == EPOCHS * 4
    return out


@pytest.fixture(scope="module")
def reference(videos):
    paths, _ = videos
    return paths, straight_run(paths)


def recipe(code: str, hook: str, instead: str) -> str:
    """A page's example ``code`` with ``hook`` (a line of it) preceded by ``instead``: where the
    child records each batch the training step takes."""
    assert code.count(hook) == 1, f"the line {hook!r} is no longer in the recipe"
    return code.replace(hook, instead + hook)


def run(code: str, paths, cwd, **names) -> list:
    """``code`` after PRELUDE and ``names`` in a fresh interpreter in ``cwd``; the batches it recorded."""
    script = PRELUDE + "".join(f"{k} = {v!r}\n" for k, v in names.items()) + code + \
        "\nprint(json.dumps(seen))\n"
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(paths)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                                                       "PYTHONPATH": ROOT, "KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(first: list, resumed: list, straight: list, stop: int) -> None:
    assert first == straight[:stop], "the stopped run did not train on the straight run's first batches"
    assert len(resumed) == len(straight) - stop, f"the resumed run trained {len(resumed)} batches"
    assert resumed == straight[stop:], "the resumed run differs from the straight run"


def test_lightning_fit_stopped_mid_epoch_resumes_from_its_checkpoint(reference, tmp_path):
    need("lightning", "the trainers extra (make test installs it)")
    paths, straight = reference
    code = recipe(doc_example("lightning-resume"), TORCH_STEP, "seen.append(codes(batch)); ")
    first = run(code, paths, tmp_path, max_steps=STOP, ckpt_path=None)
    ckpt = tmp_path / "checkpoints" / f"epoch=1-step={STOP}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(tmp_path / "checkpoints"))
    resumed = run(code, paths, tmp_path, max_steps=-1, ckpt_path=str(ckpt))
    check(first, resumed, straight, STOP)


def test_accelerate_load_state_resumes_mid_epoch(reference, tmp_path):
    need("accelerate", "the trainers extra (make test installs it)")
    paths, straight = reference
    code = recipe(doc_example("accelerate-resume"), TORCH_STEP, "seen.append(codes(batch)); ")
    first = run(code, paths, tmp_path, max_steps=STOP, resume_from=None)
    resumed = run(code, paths, tmp_path, max_steps=None, resume_from=f"checkpoints/step-{STOP}")
    check(first, resumed, straight, STOP)


def test_a_plain_loop_resumes_mid_epoch(reference, tmp_path):
    paths, straight = reference
    code = recipe(doc_example("loop-resume"), "...  # the training step", "seen.append(codes(batch)); ")
    first = run(code, paths, tmp_path, max_steps=STOP)
    assert json.loads((tmp_path / "loader.json").read_text())["epoch"] == 1  # mid epoch 1
    resumed = run(code, paths, tmp_path, max_steps=None)
    check(first, resumed, straight, STOP)


KERAS_MODEL = textwrap.dedent("""
    import keras

    class Recorder(keras.Model):
        # The batches fit trains on, in order (run_eagerly: train_step sees the arrays).
        def __init__(self):
            super().__init__()
            self.head = keras.layers.Dense(3)

        def call(self, x):
            return self.head(keras.ops.mean(keras.ops.cast(x, "float32"), axis=(1, 2, 3)))

        def train_step(self, data):
            seen.append(codes({"video": data[0]}))
            return super().train_step(data)

    model = Recorder()
    model.build((None, 4, 64, 64, 3))  # built, as a Sequential or functional model is
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), run_eagerly=True)
""")


def test_keras_fit_initial_epoch_resumes_where_the_last_epoch_ended(reference, tmp_path):
    need("tensorflow", "the tf extra (make test installs it)")
    paths, straight = reference
    code = doc_example("keras-resume")
    assert code.count("epochs=3,") == 1
    first = run(KERAS_MODEL + code.replace("epochs=3,", "epochs=2,"), paths, tmp_path)
    assert json.loads((tmp_path / "loader.json").read_text())["epoch"] == 2
    resumed = run(KERAS_MODEL + code, paths, tmp_path)
    # Keras before 3.15 (3.5 here in the oldest lane) fetches an epoch's batches through an
    # executor and trains them in another order than it took them: each epoch holds the same
    # batches as the straight run's, in an order Keras chooses.
    def by_epoch(batches):
        return [sorted(batches[e:e + 4]) for e in range(0, len(batches), 4)]

    check(by_epoch(first), by_epoch(resumed), by_epoch(straight), 2)


def codes_of(loader, n: int | None = None) -> list:
    """The video ids of the next ``n`` batches of ``loader`` (None: the rest of a pass)."""
    it = iter(loader)  # the count first: zip would take one batch too many from the loader
    return [read_codes(b["video"])[0][:, 0].tolist() for _, b in zip(range(n or 1 << 30), it)]


def test_a_state_in_any_epoch_resumes_a_loader_iterated_per_epoch(reference):
    """Without a trainer: ``Loader(epochs=1, state=<a state in epoch 2>)`` delivers the rest of
    epoch 2 on its first iteration, not nothing; with ``epochs=2`` a state in epoch 3 finishes the
    pass of epochs 2-3 and the next iteration runs epochs 4-5."""
    paths, _ = reference
    clips = shmloader.VideoClips(paths, [i % 3 for i in range(len(paths))], clip_len=4, clips_per_video=2,
                                 size=(64, 64))
    settings = dict(batch_size=BATCH, shuffle=True, seed=0)
    with shmloader.Loader(clips, **settings, epochs=2) as loader:
        flat = [b for _ in range(3) for b in codes_of(loader)]
    assert len(flat) == 24
    for epochs, before, first, second in ((2, 13, flat[13:16], flat[16:24]), (1, 11, flat[11:12], flat[12:16])):
        with shmloader.Loader(clips, **settings, epochs=epochs) as loader:
            passes, rest = divmod(before, 4 * epochs)
            for _ in range(passes):
                codes_of(loader)
            codes_of(loader, rest)
            state = loader.state()
        assert (state["epoch"], state["batch"]) == divmod(before, 4)
        with shmloader.Loader(clips, **settings, epochs=epochs, state=state) as loader:
            assert codes_of(loader) == first, f"epochs={epochs}: the first iteration after resuming"
            assert codes_of(loader) == second, f"epochs={epochs}: the next iteration"


def test_a_state_this_loader_cannot_serve_says_why(reference, tmp_path):
    paths, _ = reference
    clips = shmloader.VideoClips(paths, [i % 3 for i in range(len(paths))], clip_len=4, size=(64, 64))
    with shmloader.Loader(clips, batch_size=2, epochs=1) as loader:
        next(iter(loader))
        state = loader.state()
    assert state["dataset"] == clips.fingerprint()
    other = shmloader.VideoClips(paths[::-1], [i % 3 for i in range(len(paths))], clip_len=4, size=(64, 64))
    with pytest.raises(shmloader.StateError, match="another dataset"):
        shmloader.Loader(other, batch_size=2, epochs=1, state=state)
    with pytest.raises(shmloader.StateError, match=r"batch_size=2 \(now 4\)"):
        shmloader.Loader(clips, batch_size=4, epochs=1, state=state)
    with pytest.raises(shmloader.StateError, match="outside an epoch of 4 batches"):
        shmloader.Loader(clips, batch_size=2, epochs=1, state={**state, "batch": 9})
    with pytest.raises(shmloader.StateError, match="a dict returned by Loader.state"):
        shmloader.Loader(clips, batch_size=2, epochs=1, state=json.dumps(state))
    # a LoaderError and a ValueError: both kinds of handler catch it
    assert issubclass(shmloader.StateError, shmloader.LoaderError) and issubclass(shmloader.StateError, ValueError)
