"""PyTorch: zero-copy tensors over the ring, the pin-memory thread, DDP shards, resumable state."""

from __future__ import annotations

import gc
import json
import os
import socket
import textwrap
import time
import warnings

import numpy as np
import pytest
import torch

import shmloader
from shmloader.video.samples import read_codes

from ._examples import doc_example, run_child

pytestmark = pytest.mark.timeout(240)


def check(batch, frame_step=1):
    """The clip's frame codes name its video and consecutive frames from its start."""
    ids, frames = read_codes(batch["video"].numpy())
    assert (ids == batch["index"].numpy()[:, None]).all()
    starts = batch["start"].numpy()[:, None]
    assert (frames == starts + frame_step * np.arange(frames.shape[1])).all()


def key(batch) -> list:
    return [batch["index"].tolist(), batch["start"].tolist(), int(batch["video"].sum())]


def pinned_loader(loader, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "CUDA is not available": this machine's case
        return loader.as_torch(pin_memory=True, **kw)


def test_tensors_are_the_ring_slots_no_copy(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=3, workers=2, shuffle=True, epochs=2) as loader:
        n = 0
        for batch in loader.as_torch():
            assert set(batch) == {"video", "label", "index", "start", "frames", "times"}
            assert all(isinstance(t, torch.Tensor) for t in batch.values())
            assert batch["video"].dtype == torch.uint8 and batch["label"].dtype == torch.int64
            assert batch["video"].shape[1:] == (4, 48, 64, 3)
            for t in batch.values():
                assert loader._ring.contains(t.data_ptr())
            check(batch)
            n += 1
        assert n == 2 * len(loader) and loader.stats()["copied"] == 0


def test_tensor_held_across_many_batches_never_changes(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=4, shuffle=True, epochs=5) as loader:
        batches = iter(loader.as_torch())
        first = next(batches)
        held = first["video"][1]  # a view: the batch's own tensors are dropped below
        held_index, held_start = int(first["index"][1]), int(first["start"][1])
        snapshot = held.clone()
        del first
        rest = 0
        for batch in batches:
            check(batch)
            rest += 1
        assert rest == 5 * len(loader) - 1
        assert torch.equal(held, snapshot)
        ids, frames = read_codes(held.numpy()[None])
        assert (ids == held_index).all() and (frames[0] == held_start + np.arange(4)).all()
        assert loader.stats()["copied"] == 0
        del batch
        gc.collect()
        assert loader.stats()["leased"] == 1  # the held view keeps its slot, nothing else does
        del held
        gc.collect()
        assert loader.stats()["leased"] == 0


def test_pin_memory_thread_copies_into_reused_buffers(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=4, shuffle=True, epochs=6) as loader:
        pinned = pinned_loader(loader)
        addresses, n = set(), 0
        batches = iter(pinned)
        first = next(batches)
        # One view of one field survives; the dict and every other tensor of its batch are gone.
        held = first["video"][1]
        held_index, held_start = int(first["index"][1]), int(first["start"][1])
        snapshot = held.clone()
        del first
        gc.collect()
        for batch in batches:
            assert not loader._ring.contains(batch["video"].data_ptr())  # a copy, not the slot
            check(batch)
            addresses.add(batch["video"].data_ptr())
            n += 1
        assert n == 6 * len(loader) - 1
        assert torch.equal(held, snapshot)  # its buffer was not reused while the view lived
        ids, frames = read_codes(held.numpy()[None])
        assert (ids == held_index).all() and (frames[0] == held_start + np.arange(4)).all()
        # 23 batches through a handful of buffers: reused, never one per batch.
        assert pinned._pin.buffers.allocated <= 6 and len(addresses) <= 5
        assert loader.stats()["leased"] == 0  # the ring is not held by what the consumer keeps
        del batch
        pinned.close()
        assert not pinned._pin.alive


def test_pin_memory_loop_left_early_is_continued(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    kw = dict(batch_size=2, workers=2, shuffle=True, seed=2, epochs=2)
    with shmloader.Loader(clips, **kw) as loader:
        expected = [key(b) for b in loader.as_torch()]
    with shmloader.Loader(clips, **kw) as loader:
        pinned = pinned_loader(loader)
        got = []
        for b in pinned:
            got.append(key(b))
            if len(got) == 3:
                break
        got += [key(b) for b in pinned]  # the same pass goes on: nothing the thread copied is lost
        assert got == expected
        got_next = [key(b) for b in pinned]  # and then the loader's next pass
        assert len(got_next) == 2 * len(loader) and got_next != expected
        pinned.close()


def test_loop_left_early_is_continued_by_the_next_one(videos):
    """Without pin_memory too: a loop left early and a new ``for`` over the same adapter go on
    with the same pass, nothing lost or repeated; after the pass, the loader's next pass."""
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    kw = dict(batch_size=2, workers=2, shuffle=True, seed=2, epochs=2)
    with shmloader.Loader(clips, **kw) as loader:
        expected = [key(b) for b in loader.as_torch()]
        after = [key(b) for b in loader.as_torch()]  # the loader's next pass, as iterating again runs it
    assert len(after) == len(expected) and after != expected
    with shmloader.Loader(clips, **kw) as loader:
        batches = loader.as_torch()
        got = []
        for b in batches:
            got.append(key(b))
            if len(got) == 3:
                break
        for b in batches:
            got.append(key(b))
            if len(got) == 7:
                break
        got += [key(b) for b in batches]
        assert got == expected
        assert [key(b) for b in batches] == after
        assert batches.state_dict()["epoch"] == 4  # every batch handed out was counted once


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_pin_memory_without_cuda_warns_and_copies_into_ordinary_buffers(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=2, workers=1) as loader:
        with pytest.warns(RuntimeWarning, match="pin_memory=True but CUDA is not available"):
            pinned = loader.as_torch(pin_memory=True)
        batch = next(iter(pinned))
        check(batch)
        assert not loader._ring.contains(batch["video"].data_ptr()) and not batch["video"].is_pinned()
        del batch
        pinned.close()
    with shmloader.Loader(clips, batch_size=2, workers=1) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning without pin_memory
            assert len(list(loader.as_torch())) == len(loader)


def test_pin_memory_raises_the_sample_error_with_its_cause():
    def fn(i, rng):
        if i == 5:
            raise ValueError("row 5 is damaged")
        return {"x": np.full(3, i, np.int64)}

    source = shmloader.FunctionSource(fn, {"x": ((3,), np.int64)}, 8, check=False)
    with shmloader.Loader(source, batch_size=2, workers=1) as loader:
        seen = []
        with pytest.raises(shmloader.SampleError, match="ValueError: row 5 is damaged") as info:
            for b in pinned_loader(loader):
                seen += b["x"][:, 0].tolist()
        # Batches ready before the failing one may or may not have been handed out first (the
        # loader raises as soon as it reads the failure), but never out of order or wrong.
        assert seen in ([], [0, 1], [0, 1, 2, 3])
        assert info.value.index == 5 and "row 5 is damaged" in info.value.__cause__.tb


def test_conv3d_sgd_step(videos):
    paths, labels = videos
    namespace = {"paths": paths, "labels": labels}
    exec(doc_example("torch-train"), namespace)
    model, loss = namespace["model"], namespace["loss"]
    assert torch.isfinite(loss)
    # One more SGD step on one batch lowers the loss on that batch: gradients reach the Conv3d.
    # The example moved the model to CUDA where there is one: the batch goes where the model is.
    device = next(model.parameters()).device
    assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    with shmloader.Loader(namespace["clips"], batch_size=4, seed=1) as loader:
        batch = {k: v.to(device) for k, v in next(iter(loader.as_torch())).items()}
    video = batch["video"].permute(0, 4, 1, 2, 3).float() / 255
    conv_before = model[0].weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    before = torch.nn.functional.cross_entropy(model(video), batch["label"])
    optimizer.zero_grad()
    before.backward()
    optimizer.step()
    after = torch.nn.functional.cross_entropy(model(video), batch["label"])
    assert after.item() < before.item()
    assert not torch.equal(model[0].weight, conv_before)


@pytest.mark.parametrize("pin_memory", [False, True])
def test_resume_after_n_batches_is_exact(videos, tmp_path, pin_memory):
    """The docs' resume example, stopped after 5 batches and run again, delivers the rest of
    an uninterrupted run exactly (pixels included); the pin thread's prefetch is not counted."""
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(32, 40))
    kw = dict(batch_size=3, workers=2, shuffle=True, seed=7, epochs=3)
    with shmloader.Loader(clips, **kw) as loader:
        expected = [key(b) for b in loader.as_torch()]

    class Stop(Exception):
        pass

    def run(limit=None):
        seen = []

        def train_step(batch):
            seen.append(key(batch))
            if len(seen) == limit:
                # The crash comes once the pin thread has copied batches ahead (its queue has room
                # for 2): those must not count as consumed. No timing: wait until it has.
                deadline = time.monotonic() + 60
                while pin_memory and loader.stats()["batches"] <= limit and time.monotonic() < deadline:
                    time.sleep(0.01)
                raise Stop

        with shmloader.Loader(clips, **kw) as loader:
            example = doc_example("torch-resume")
            if not pin_memory:
                example = example.replace("pin_memory=True", "pin_memory=False")
            namespace = {"loader": loader, "train_step": train_step, "torch": torch, "os": os}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    exec(example, namespace)
                except Stop:
                    pass
            if pin_memory and limit:
                assert loader.stats()["batches"] > limit  # the thread had copied ahead
            namespace["batches"].close()
        return seen

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        first = run(limit=5)
        saved = torch.load("loader.pt")
        json.dumps(saved)  # plain JSON-serialisable data
        assert (saved["epoch"], saved["batch"]) == divmod(4, len(expected) // 3)  # after 4 saved steps
        rest = run()
    finally:
        os.chdir(cwd)
    # The 5th batch was taken but its step failed before the checkpoint: it comes again.
    assert first[:4] + rest == expected
    with shmloader.Loader(clips, **kw, state=saved) as loader:  # the same state, the Loader's own way
        assert [key(b) for b in loader.as_torch()] == expected[4:]


def test_load_state_dict_refuses_after_the_first_batch_and_other_settings(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    with shmloader.Loader(clips, batch_size=2, workers=1, shuffle=True, seed=1) as loader:
        batches = loader.as_torch()
        state = batches.state_dict()
        with pytest.raises(ValueError, match="seed=1 .now 2."):
            with shmloader.Loader(clips, batch_size=2, workers=1, shuffle=True, seed=2) as other:
                other.as_torch().load_state_dict(state)
        it = iter(batches)
        next(it)
        with pytest.raises(shmloader.LoaderError, match="before the first batch"):
            batches.load_state_dict(state)
        del it


def test_explicit_shard_and_device(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, clips_per_video=2, sampling="uniform", size=(32, 40))
    seen = []
    for rank in range(2):
        with shmloader.Loader(clips, batch_size=2, workers=1, shuffle=True, seed=3) as loader:
            batches = loader.as_torch(shard=(rank, 2), device="cpu")
            assert len(batches) == 4
            seen.append({(i, s) for b in batches for i, s in zip(b["index"].tolist(), b["start"].tolist())})
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 16
    if not torch.cuda.is_available():
        with shmloader.Loader(clips, batch_size=2, workers=1) as loader:
            with pytest.raises(ValueError, match="CUDA is not available"):
                loader.as_torch(device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (tests/gpu_check.py's checks)")
@pytest.mark.parametrize("pin_memory", [False, True])
def test_cuda_batches_equal_the_host_batches_behind_a_busy_stream(videos, pin_memory):
    """``device="cuda"``: tensors on the GPU hold the frame codes of the host batch, even when the
    stream is busy so that the non-blocking copies run long after ``to()`` returned (a host batch
    freed or reused before its copy is done would show as wrong codes). Kept device batches keep
    what they arrived with."""
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    kw = dict(batch_size=2, workers=2, slots=3, shuffle=True, seed=4, epochs=4)
    with shmloader.Loader(clips, **kw) as loader:
        expected = [key(b) for b in loader.as_torch()]
    with shmloader.Loader(clips, **kw) as loader:
        batches = loader.as_torch(pin_memory=pin_memory, device="cuda")
        kept = []
        for b in batches:
            assert all(t.is_cuda for t in b.values())
            torch.cuda._sleep(50_000_000)  # the copies queued next wait behind this
            kept.append(b)  # no host synchronisation until the end
        torch.cuda.synchronize()
        got = []
        for b in kept:
            host = {k: v.cpu() for k, v in b.items()}
            check(host)
            got.append(key(host))
        assert got == expected
        batches.close()


RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    import shmloader

    # One compute thread per rank: two ranks' OpenMP teams spin-wait for each other's threads on
    # a busy 2-core machine (a DDP step took minutes, past the test's deadline).
    torch.set_num_threads(1)
    port, rank, paths = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Conv3d(3, 4, 3), torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(4, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clips = shmloader.VideoClips(paths, [i % 3 for i in range(len(paths))], clip_len=4, clips_per_video=2,
                                 sampling="uniform", size=(32, 40))
    seen = []
    with shmloader.Loader(clips, batch_size=2, workers=1, shuffle=True, seed=5, drop_remainder=True) as loader:
        for batch in loader.as_torch():  # the shard comes from the process group
            seen += [[i, s] for i, s in zip(batch["index"].tolist(), batch["start"].tolist())]
            video = batch["video"].permute(0, 4, 1, 2, 3).float() / 255
            loss = torch.nn.functional.cross_entropy(model(video), batch["label"])
            optimizer.zero_grad()
            loss.backward()  # gradients all-reduced across the two ranks
            optimizer.step()
    weights = [p.detach().sum().item() for p in model.parameters()]
    everyone = [None, None]
    dist.all_gather_object(everyone, seen)
    dist.destroy_process_group()
    print(json.dumps({"seen": seen, "everyone": everyone, "weights": weights}), flush=True)
    # Leave without the interpreter's teardown: gloo's threads can still be joinable when it
    # destroys them (torch 2.14, now and then: "terminate called without an active exception",
    # SIGABRT after the line above; pytorch/pytorch#190489). The loader closed above.
    import os
    os._exit(0)
""")


def test_ddp_two_ranks_with_gloo_get_disjoint_complete_shards(videos):
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    paths, _ = videos
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def rank(r):
        return run_child(RANK, str(port), str(r), json.dumps(paths))

    try:
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(rank, range(2))
    except subprocess.TimeoutExpired:  # pragma: no cover
        raise AssertionError(f"a DDP rank did not finish ({sys.executable})")
    mine = [{tuple(x) for x in r["seen"]} for r in (a, b)]
    every_clip = {(v, c * (40 - 4)) for v in range(len(paths)) for c in range(2)}
    assert len(a["seen"]) == len(b["seen"]) == 8  # every rank took the same number of steps
    assert mine[0].isdisjoint(mine[1]) and mine[0] | mine[1] == every_clip
    assert a["everyone"] == [a["seen"], b["seen"]]  # the process group really joined the two
    assert np.allclose(a["weights"], b["weights"])  # DDP kept the replicas in step


def test_import_error_names_the_extra():
    script = textwrap.dedent("""
        import json, sys
        sys.modules["torch"] = None  # as if torch were not installed
        import numpy as np
        import shmloader
        errors = []
        try:
            import shmloader.torch
        except ImportError as e:
            errors.append(str(e))
        src = shmloader.FunctionSource(lambda i, rng: {"x": np.zeros(1)}, {"x": ((1,), np.float64)}, 2)
        with shmloader.Loader(src, batch_size=2, workers=1) as loader:
            try:
                loader.as_torch()
            except ImportError as e:
                errors.append(str(e))
        print(json.dumps(errors))
    """)
    errors = run_child(script)
    assert len(errors) == 2 and all("pip install './shmloader[torch]'" in e for e in errors)


def test_shmloader_alone_imports_no_framework():
    script = textwrap.dedent("""
        import json, sys
        import shmloader
        print(json.dumps(sorted(m for m in ("torch", "jax", "keras", "tensorflow") if m in sys.modules)))
    """)
    assert run_child(script) == []
