"""shmloader.calibrate: the model's ceiling on synthetic batches, what the loader feeds it one
clip per sample and grouped, and a prediction that a real run with those settings bears out
(issue #36). Real videos, real workers, a real torch model whose step time is known."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ._needs import need

import shmloader
from shmloader.samples import make_videos

torch = need("torch")

pytestmark = pytest.mark.timeout(240)

SLEEP_S = 0.01  # the step's known time: a GPU step the host waits for, without taking a core
BATCH = 4


@pytest.fixture(scope="module")
def long_gop_clips(tmp_path_factory):
    """16 videos of 120 frames, a keyframe every 60: one random clip costs decoding from its
    keyframe, so one clip per sample decodes slower than the step takes batches."""
    paths, labels = make_videos(tmp_path_factory.mktemp("gop60"), count=16, frames=120, size=(96, 128), gop=60)
    return shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))


def make_step():
    torch.set_num_threads(1)
    conv = torch.nn.Conv3d(3, 4, 3)

    def step(batch):
        x = torch.from_numpy(batch["video"][:, :4, :16, :16]).permute(0, 4, 1, 2, 3).float()
        with torch.no_grad():
            conv(x)
        time.sleep(SLEEP_S)

    return step


def real_run(clips, step, seconds: float, warm: int = 4) -> float:
    """Samples/s of a training loop: the loader as calibrate runs it, the step on every batch."""
    with shmloader.Loader(clips, batch_size=BATCH, workers=2, shuffle=True, epochs=None) as loader:
        n = 0
        for i, batch in enumerate(loader):
            step(batch)
            if i == warm:
                t0 = time.perf_counter()
            elif i > warm:
                n += len(batch["video"])
                if time.perf_counter() - t0 >= seconds:
                    return n / (time.perf_counter() - t0)
    raise AssertionError("unreachable: the loader runs for ever")


def test_predicted_fed_fraction_matches_a_real_run(long_gop_clips, capsys):
    step = make_step()
    # Real runs just before and just after: other work on the machine changes every rate by
    # itself. Where the two disagree by more than a fifth, the load moved during the calibration
    # and it is measured again (three tries); the prediction must then match a real run beside it.
    for _ in range(3):
        before = real_run(long_gop_clips, step, seconds=3)
        r = shmloader.calibrate(long_gop_clips, step, batch_size=BATCH, workers=2, seconds=12)
        table = capsys.readouterr().out
        after = real_run(long_gop_clips, step, seconds=3)
        if abs(before - after) <= 0.2 * max(before, after):
            break
    assert set(r) == {"ceiling", "step_cpu_s", "one_clip", "grouped_4", "grouped_8", "workers", "cpus"}
    assert r["workers"] == 2 and r["step_cpu_s"] > 0
    # No step is faster than its sleep; the conv on 4 tiny clips takes a fraction of it.
    assert 0.3 * BATCH / SLEEP_S < r["ceiling"] <= BATCH / SLEEP_S
    one = r["one_clip"]
    for row in (one, r["grouped_4"], r["grouped_8"]):
        says_one_thing(row, r)
    # Grouped decode shares each keyframe's lead-in among 8 clips: it decodes fewer frames for
    # each it delivers (a count, not a speed: the machine may be busy with other work).
    assert r["grouped_8"]["decoded_per_frame"] < r["grouped_4"]["decoded_per_frame"] < one["decoded_per_frame"]
    assert "synthetic (the model's ceiling)" in table and "clips_per_video=8, group_clips=True" in table

    reals = [min(1.0, x / r["ceiling"]) for x in (before, after, (before + after) / 2)]
    assert min(abs(one["fed_fraction"] - x) / x for x in reals) <= 0.25, (one, before, after, r["ceiling"])


def says_one_thing(row: dict, r: dict) -> None:
    """A row's fed fraction, workers needed and cores short agree: fed as much as any input can
    be (``most_fed``, the hand-off's time aside) exactly when its workers suffice and no core is
    short; fed is the predicted rate over the ceiling."""
    assert row["fed_fraction"] == pytest.approx(min(1.0, row["predicted_per_s"] / r["ceiling"]))
    assert row["predicted_per_s"] <= min(r["ceiling"], row["samples_per_worker_s"] * r["workers"]) * (1 + 1e-9)
    assert 0 < row["most_fed"] <= 1 and row["fed_fraction"] <= row["most_fed"] * (1 + 1e-9)
    fed = row["fed_fraction"] >= row["most_fed"] * (1 - 1e-9)
    assert fed == (row["workers_needed"] <= r["workers"] and row["more_cores"] == 0), row
    assert row["more_cores"] >= max(0, row["workers_needed"] - r["cpus"])  # the step's CPU comes on top


def test_a_slow_step_is_fed_and_the_table_agrees(long_gop_clips, capsys):
    """A step of 400 ms: every row is fed, needs no more workers and no more cores than it has,
    as a real run beside it shows (it is never short of a batch)."""
    def step(batch):
        time.sleep(0.4)

    r = shmloader.calibrate(long_gop_clips, step, batch_size=BATCH, workers=2, seconds=6)
    table = capsys.readouterr().out
    for key in ("one_clip", "grouped_4", "grouped_8"):
        says_one_thing(r[key], r)
        assert r[key]["fed_fraction"] == pytest.approx(1.0, abs=0.01) and r[key]["more_cores"] == 0, r[key]
    assert r["ceiling"] == pytest.approx(BATCH / 0.4, rel=0.2)
    fed = min(1.0, real_run(long_gop_clips, step, seconds=2, warm=1) / r["ceiling"])
    assert fed == pytest.approx(r["one_clip"]["fed_fraction"], rel=0.1)
    lines = table.splitlines()
    assert lines[2].split()[-2:] == ["-", "-"] and all(line.split()[-3:-2] == ["1.00"] for line in lines[3:6]), table


def test_any_callable_and_any_source(capsys):
    """A step that is not torch, a source that is not video: the grouped rows are None."""
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.full(8, i, np.float32)}, {"x": ((8,), np.float32)}, 64)
    seen = []

    def step(batch):
        seen.append(batch["x"].shape)
        time.sleep(0.002)

    r = shmloader.calibrate(src, step, batch_size=8, workers=1, seconds=1, verbose=False)
    assert capsys.readouterr().out == ""
    assert r["grouped_4"] is None and r["grouped_8"] is None
    assert 0 < r["ceiling"] <= 8 / 0.002 and 0 < r["one_clip"]["fed_fraction"] <= 1.0
    assert seen and all(s == (8, 8) for s in seen)
    with pytest.raises(TypeError, match="step must be callable"):
        shmloader.calibrate(src, None, batch_size=8)  # type: ignore[arg-type]
