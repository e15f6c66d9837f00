"""shmloader.calibrate: the prediction's arithmetic on given measurements, the runs it measures
(each delivering the source's clips, counted after the warm-up), and the structure of its result
(issue #36). Nothing here compares a speed with this machine's: `bench/calibrate_check.py` puts
the prediction beside a real training loop."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time

import numpy as np
import pytest

import shmloader
from shmloader._calibrate import calibration_table, measure_loader, measure_steps, predict
from shmloader.samples import make_videos

from ._needs import need

pytestmark = pytest.mark.timeout(240)

SLEEP_S = 0.01  # the step's known time: a GPU step the host waits for, without taking a core
BATCH = 4


def figures(samples_per_s: float, worker_cpu_s: float, main_cpu_s: float, decoded: float | None = 2.5) -> dict:
    """What ``measure_loader`` returns, as given numbers."""
    return {"samples_per_s": samples_per_s, "worker_cpu_s": worker_cpu_s, "main_cpu_s": main_cpu_s,
            "samples": 100, "stats": {"decoded_per_frame": decoded}}


# (measurements, ceiling, step CPU s per sample, workers, cpus) -> (predicted/s, fed, most fed,
# per worker/s, workers needed, cores short), worked out by hand from NOTE [ What calibrate predicts ].
CASES = {
    # one worker decodes 20/s (1 / 0.05 CPU s, and 40/s over 2 workers): decode-bound at 40/s; the
    # loop allows T = 1 / (1/100 + 0.001) = 90.9/s: ceil(90.9 / 20) = 5 workers, 4.55 + 90.9 * 0.002
    # = 4.73 cores, one more than 4.
    "decode-bound": ((figures(40, 0.05, 0.001), 100, 0.001, 2, 4), (40, 0.4, 0.90909, 20, 5, 1)),
    # 200/s a worker (the loader alone's 400/s over 2; less than 1 / 0.004): the loop's 90.9/s.
    "step-bound": ((figures(400, 0.004, 0.001), 100, 0.001, 2, 4), (90.909, 0.90909, 0.90909, 200, 1, 0)),
    # 4 workers on 2 CPUs, the step 0.02 CPU s a sample: 20 * 2 / (1 + 20 * 0.02) = 28.6/s; to reach
    # 100/s, 5 workers and 5 + 100 * 0.02 = 7 cores, 5 more than 2.
    "core-bound": ((figures(80, 0.05, 0.0), 100, 0.02, 4, 2), (28.571, 0.28571, 1.0, 20, 5, 5)),
    # the workers delivered nothing: no rate to scale, nothing needed can be said.
    "nothing": ((figures(0, 0.0, 0.0, None), 100, 0.001, 2, 2), (0, 0, 1.0, 0, None, None)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prediction_arithmetic_on_given_measurements(case):
    given, (x, fed, most, per_worker, needed, short) = CASES[case]
    row = predict(*given)
    assert isinstance(row, shmloader.CalibrationRow)
    assert row.samples_per_s == given[0]["samples_per_s"]
    assert row.predicted_per_s == pytest.approx(x, rel=1e-4) and row.fed_fraction == pytest.approx(fed, rel=1e-4)
    assert row.most_fed == pytest.approx(most, rel=1e-4)
    assert row.samples_per_worker_s == pytest.approx(per_worker)
    assert (row.workers_needed, row.more_cores) == (needed, short)
    assert row.decoded_per_frame == given[0]["stats"]["decoded_per_frame"]


def says_one_thing(row: shmloader.CalibrationRow, ceiling: float, workers: int, cpus: int) -> None:
    """A row's fed fraction, workers needed and cores short agree: fed as much as any input can
    be (``most_fed``, the hand-off's time aside) exactly when its workers suffice and no core is
    short; fed is the predicted rate over the ceiling."""
    assert row.fed_fraction == pytest.approx(min(1.0, row.predicted_per_s / ceiling))
    assert row.predicted_per_s <= min(ceiling, row.samples_per_worker_s * workers) * (1 + 1e-9)
    assert 0 < row.most_fed <= 1 and row.fed_fraction <= row.most_fed * (1 + 1e-9)
    fed = row.fed_fraction >= row.most_fed * (1 - 1e-9)
    assert row.workers_needed is not None and row.more_cores is not None
    assert fed == (row.workers_needed <= workers and row.more_cores == 0), row
    assert row.more_cores >= max(0, row.workers_needed - cpus)  # the step's CPU comes on top


def test_every_predicted_row_says_one_thing():
    """Over a grid of measurements, decode-, step- and core-bound alike."""
    grid = itertools.product([5.0, 40.0, 400.0], [0.002, 0.02, 0.2], [0.0, 0.001, 0.01], [10.0, 100.0, 1000.0],
                             [0.0, 0.001, 0.02], [1, 2, 8], [1, 2, 16])
    for rate, wcpu, main, ceiling, step_cpu, workers, cpus in grid:
        says_one_thing(predict(figures(rate, wcpu, main), ceiling, step_cpu, workers, cpus), ceiling, workers, cpus)


def test_measured_steps_count_the_samples_after_the_warm_up():
    """Every batch reaches the step, in order; the first ``warm`` are left out of the count."""
    batches = [{"x": np.zeros((n, 2))} for n in (4, 4, 3, 4, 2)]
    seen = []
    m = measure_steps(iter(batches), lambda b: seen.append(len(b["x"])), seconds=60, warm=1,
                      pids=lambda: [os.getpid()])
    assert seen == [4, 4, 3, 4, 2]
    assert m["samples"] == 3 + 4 + 2 and m["samples_per_s"] > 0
    assert m["main_cpu_s"] >= 0 and m["worker_cpu_s"] >= 0


def test_the_measured_loader_delivers_the_sources_samples():
    """``measure_loader``: each batch the source's own samples, the count
    those after the warm-up (2 batches a worker), and the loader's stats."""
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.full(8, i, np.float32)}, {"x": ((8,), np.float32)}, 64)
    batches = []

    def step(batch):
        batches.append({k: np.array(v) for k, v in batch.items()})
        time.sleep(0.002)

    m = measure_loader(src, 8, 2, seconds=0.5, step=step)
    assert len(batches) > 5
    for b in batches:  # each row sample i's, 8 distinct samples a batch (one epoch's, shuffled)
        ids = b["x"][:, 0].astype(int).tolist()
        assert b["x"].shape == (8, 8) and (b["x"] == b["x"][:, :1]).all()
        assert set(ids) <= set(range(64)) and len(set(ids)) == 8
    assert m["samples"] == 8 * (len(batches) - 1 - 2 * 2)
    assert m["stats"]["batches"] >= len(batches)


@pytest.fixture(scope="module")
def long_gop_clips(tmp_path_factory):
    """16 videos of 120 frames, a keyframe every 60: one random clip costs decoding from its
    keyframe, which grouped decode shares among a video's clips."""
    paths, labels = make_videos(tmp_path_factory.mktemp("gop60"), count=16, frames=120, size=(96, 128), gop=60)
    return shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))


def test_calibrate_returns_a_row_for_the_clips_and_each_grouping(long_gop_clips, capsys):
    torch = need("torch")
    torch.set_num_threads(1)
    conv = torch.nn.Conv3d(3, 4, 3)

    def step(batch):
        x = torch.from_numpy(batch["video"][:, :4, :16, :16]).permute(0, 4, 1, 2, 3).float()
        with torch.no_grad():
            conv(x)
        time.sleep(SLEEP_S)

    r = shmloader.calibrate(long_gop_clips, step, batch_size=BATCH, workers=2, seconds=4, groupings=(2, 8))
    table = capsys.readouterr().out
    assert isinstance(r, shmloader.Calibration) and sorted(r.grouped) == [2, 8]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.ceiling = 0.0  # type: ignore[misc]
    assert r.workers == 2 and r.cpus >= 1 and r.step_cpu_s > 0
    assert 0 < r.ceiling <= BATCH / SLEEP_S  # no step is faster than its sleep
    for row in (r.one_clip, *r.grouped.values()):
        says_one_thing(row, r.ceiling, r.workers, r.cpus)
    # Grouped decode shares each keyframe's lead-in among 8 clips: it decodes fewer frames for
    # each it delivers (a count, not a speed).
    assert r.grouped[8].decoded_per_frame < r.one_clip.decoded_per_frame
    lines = table.splitlines()
    assert lines[2].startswith("synthetic (the model's ceiling)") and lines[3].startswith("loader, one clip per sample")
    assert lines[4].startswith("loader, clips_per_video=2, group_clips=True")
    assert lines[5].startswith("loader, clips_per_video=8, group_clips=True")
    # One keyframe every 60 frames: the one-clip row decodes several frames per delivered frame,
    # and the table ends with the prepare command.
    assert r.one_clip.decoded_per_frame >= 3
    assert lines[-1].startswith(f"one clip per sample decodes {r.one_clip.decoded_per_frame:.1f} frames per "
                                "delivered frame;"), table
    assert "shmloader prepare SRC... --out DST --short-side 128 --gop 16" in lines[-1]


def test_any_callable_and_any_source(capsys):
    """A step that is not torch, a source that is not video: no grouped rows."""
    src = shmloader.FunctionSource(lambda i, rng: {"x": np.full(8, i, np.float32)}, {"x": ((8,), np.float32)}, 64)
    seen = []

    def step(batch):
        seen.append(batch["x"].shape)
        time.sleep(0.002)

    r = shmloader.calibrate(src, step, batch_size=8, workers=1, seconds=1, verbose=False)
    assert capsys.readouterr().out == ""
    assert r.grouped == {}
    assert 0 < r.ceiling <= 8 / 0.002 and 0 <= r.one_clip.fed_fraction <= 1.0
    assert seen and all(s == (8, 8) for s in seen)
    with pytest.raises(TypeError, match="step must be callable"):
        shmloader.calibrate(src, None, batch_size=8)  # type: ignore[arg-type]
    for bad in ((0,), (4, 4), (2.5,)):
        with pytest.raises(ValueError, match="groupings"):
            shmloader.calibrate(src, step, batch_size=8, groupings=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("decoded, head, told", [(None, None, False), (2.5, 1.5, False), (2.99, 2.0, False),
                                                (3.0, 1.0, True), (7.2, 6.0, True), (6.0, 0.5, False)])
def test_the_table_names_prepare_from_3_frames_decoded_per_delivered_frame(decoded, head, told):
    """On given measurements: the one-clip row's frames decoded per delivered frame decide, where
    at least one of them lies before a clip's first frame (else a large frame_step, not the
    keyframes, is what decodes them); the grouped rows' do not."""
    one = dataclasses.replace(predict(figures(40, 0.05, 0.001), 100, 0.001, 2, 2), decoded_per_frame=decoded,
                              head_per_frame=head)
    grouped = dataclasses.replace(predict(figures(80, 0.02, 0.001), 100, 0.001, 2, 2), decoded_per_frame=9.0,
                                  head_per_frame=8.0)
    result = shmloader.Calibration(ceiling=100, step_cpu_s=0.001, workers=2, cpus=2, one_clip=one,
                                   grouped={8: grouped})
    lines = calibration_table(result).splitlines()
    assert lines[-1].startswith("(2 workers on 2 CPUs") != told, lines
    assert any("shmloader prepare SRC... --out DST" in line for line in lines) == told, lines


def test_a_row_counts_the_frames_before_each_clip():
    """``head_per_frame``: the loader's ``frames_head`` over its ``frames_delivered``."""
    m = figures(40, 0.05, 0.001)
    m["stats"].update(frames_head=300, frames_delivered=100)
    assert predict(m, 100, 0.001, 2, 2).head_per_frame == pytest.approx(3.0)
    assert predict(figures(40, 0.05, 0.001), 100, 0.001, 2, 2).head_per_frame is None
