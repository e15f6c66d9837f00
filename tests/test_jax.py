"""JAX: batches as jax.Arrays (zero-copy on the CPU backend), sharding over devices and processes."""

from __future__ import annotations

import gc
import json
import socket
import textwrap
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shmloader
import shmloader.jax
from shmloader.video.samples import read_codes

from ._examples import doc_example, run_child
from ._sound import FPS, RATE, write_av

pytestmark = pytest.mark.timeout(240)


def check(batch):
    ids, frames = read_codes(np.asarray(batch["video"]))
    assert (ids == np.asarray(batch["index"])[:, None]).all()
    assert (frames == np.asarray(batch["start"])[:, None] + np.arange(frames.shape[1])).all()


def test_batches_are_jax_arrays_over_the_ring(videos):
    paths, labels = videos
    clips = shmloader.VideoClips(paths, labels, clip_len=4, size=(48, 64))
    assert jax.default_backend() == "cpu"
    with shmloader.Loader(clips, batch_size=3, workers=2, shuffle=True, epochs=2) as loader:
        n = 0
        for batch in shmloader.jax.batches(loader, prefetch=2):  # what an accelerator gets
            assert all(isinstance(a, jax.Array) for a in batch.values())
            assert batch["video"].dtype == jnp.uint8 and batch["video"].shape[1:] == (4, 48, 64, 3)
            # On the CPU backend device_put wraps the slot's memory: no copy.
            assert loader._ring.contains(batch["video"].unsafe_buffer_pointer())
            check(batch)
            n += 1
        assert n == 2 * len(loader) and loader.stats()["copied"] == 0


def test_audio_arrives_as_jax_arrays_of_each_clips_samples(tmp_path):
    path = write_av(tmp_path / "tone.mov", "pcm_s16le")
    clips = shmloader.VideoClips([path], clip_len=4, clips_per_video=4, clips_per_sample=2, sampling="uniform",
                                 audio_rate=RATE)
    n = round(4 / FPS * RATE)
    want = clips.reader().read(range(4))
    with shmloader.Loader(clips, batch_size=2, workers=1, timeout=60) as loader:
        got = []
        for batch in shmloader.jax.batches(loader):
            assert batch["audio"].dtype == jnp.float32 and batch["audio"].shape == (2, 2, n, 1)
            assert batch["audio_len"].dtype == jnp.int32 and batch["audio_len"].shape == (2, 2)
            assert loader._ring.contains(batch["audio"].unsafe_buffer_pointer())  # no copy on the CPU
            got.append({k: np.array(batch[k]) for k in ("start", "audio", "audio_len")})
    np.testing.assert_array_equal(np.concatenate([b["start"] for b in got]), want["start"])
    np.testing.assert_array_equal(np.concatenate([b["audio_len"] for b in got]), want["audio_len"])
    np.testing.assert_allclose(np.concatenate([b["audio"] for b in got]), want["audio"], atol=1e-4)
    assert (want["audio_len"] == n).all() and np.abs(want["audio"]).max() > 0.02


def test_array_held_across_many_batches_never_changes(videos):
    paths, _ = videos
    clips = shmloader.VideoClips(paths, clip_len=4, size=(48, 64))
    # held, the batch in hand, the one JAX lets go of a step late, and the next, with room to spare:
    # 20 batches through 8 slots reuse every slot while `held` keeps its own.
    with shmloader.Loader(clips, batch_size=2, workers=2, slots=8, shuffle=True, epochs=5) as loader:
        batches = shmloader.jax.batches(loader)  # on the CPU backend: nothing put ahead
        held = next(batches)
        snapshot = {k: np.array(v) for k, v in held.items()}
        rest = sum(1 for b in batches if check(b) is None)
        assert rest == 5 * len(loader) - 1
        for k in held:
            assert (np.asarray(held[k]) == snapshot[k]).all()
        check(held)
        assert loader.stats()["copied"] == 0


def codes(i, rng):
    return {"x": np.full(1024, i % 256, np.uint8), "i": np.int32(i)}  # dtypes JAX keeps on the CPU


def code_loader(**kw):
    src = shmloader.FunctionSource(codes, {"x": ((1024,), np.uint8), "i": ((), np.int32)}, 40)
    return shmloader.Loader(src, batch_size=4, workers=1, **kw)


def test_cpu_puts_nothing_ahead_and_holds_one_slot_more():
    """On the CPU backend nothing is put ahead by default (the arrays are the slots); JAX lets
    go of a slot one batch after its array is gone: a loop holds at most 2 slots, the batch in
    hand and the one before; once the arrays are gone, no slot is held."""
    with code_loader(slots=6, shuffle=True, epochs=2) as loader:
        batches = shmloader.jax.batches(loader)
        first = next(batches)
        assert loader.stats()["batches"] == 1  # nothing delivered ahead of the consumer
        assert loader._ring.contains(first["x"].unsafe_buffer_pointer())  # the slot itself
        assert loader.stats()["leased"] == 1
        del first
        second = next(batches)
        assert loader.stats()["batches"] == 2 and loader.stats()["leased"] == 1  # the first came back
        del second
        peak, n = 0, 2
        for b in batches:
            assert loader.stats()["batches"] == n + 1
            peak = max(peak, loader.stats()["leased"])
            n += 1
        assert n == 2 * len(loader) and 1 <= peak <= 2
        assert loader.stats()["copied"] == 0
        del b
        gc.collect()
        assert loader.stats()["leased"] == 0


@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_prefetch_puts_batches_ahead_and_state_counts_steps(prefetch):
    """``prefetch=k`` delivers k batches ahead of the one in hand (what an accelerator gets by
    default, k=2); ``loader.state(consumed=steps)`` taken mid-stream resumes exactly after the
    steps really taken, not after what was put ahead."""
    kw = dict(shuffle=True, seed=3, epochs=2)
    with code_loader(**kw) as loader:
        expected = [np.asarray(b["i"]).tolist() for b in shmloader.jax.batches(loader)]
    steps = 5
    with code_loader(**kw) as loader:
        batches = shmloader.jax.batches(loader, prefetch=prefetch)
        head = []
        for b in batches:
            head.append(np.asarray(b["i"]).tolist())
            assert loader.stats()["batches"] == min(len(head) + prefetch, len(expected))
            if len(head) == steps:
                break
        state = loader.state(consumed=steps)
        del b, batches
    assert head == expected[:steps]
    with code_loader(**kw, state=state) as loader:
        assert [np.asarray(b["i"]).tolist() for b in shmloader.jax.batches(loader, prefetch=prefetch)] == expected[steps:]


def test_prefetch_default_follows_where_the_arrays_go(monkeypatch):
    """Without ``prefetch=``: nothing ahead when the arrays go to the CPU, whether ``sharding``
    is None, a CPU device or a sharding over CPU devices; 2 batches ahead when they go to an
    accelerator (the platform made to say "gpu" here, on a machine without one)."""
    def delivered_with_the_first(sharding=None) -> int:
        with code_loader() as loader:
            batches = shmloader.jax.batches(loader, sharding)
            try:
                next(batches)
                return loader.stats()["batches"]
            finally:
                batches.close()

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
    for sharding in (None, jax.devices()[0], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())):
        assert shmloader.jax._platforms(sharding) == {"cpu"}
        assert delivered_with_the_first(sharding) == 1, sharding
    monkeypatch.setattr(shmloader.jax, "_platforms", lambda sharding: {"gpu"})
    assert delivered_with_the_first() == 3


def test_prefetch_below_zero_is_refused():
    with code_loader() as loader:
        with pytest.raises(ValueError, match="prefetch must be >= 0, got -1"):
            shmloader.jax.batches(loader, prefetch=-1)


def test_jax_grad_training_step(videos):
    paths, labels = videos
    namespace = {"paths": paths, "labels": labels,
                 "clips": shmloader.VideoClips(paths, labels, clip_len=8, frame_step=2, size=(64, 64))}
    exec(doc_example("jax-train"), namespace)
    w, loss, loss_fn, step = namespace["w"], namespace["loss"], namespace["loss_fn"], namespace["step"]
    assert np.isfinite(float(loss)) and float(jnp.abs(w).sum()) > 0  # it trained
    with shmloader.Loader(namespace["clips"], batch_size=4, seed=1) as loader:
        batch = next(shmloader.jax.batches(loader))
    before = float(loss_fn(w, batch["video"], batch["label"]))
    w2, _ = step(w, batch["video"], batch["label"])
    assert float(loss_fn(w2, batch["video"], batch["label"])) < before


TWO_DEVICES = textwrap.dedent("""
    import json, sys
    import numpy as np, jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import shmloader, shmloader.jax

    paths = json.loads(sys.argv[1])
    devices = jax.local_devices()
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), P("data"))
    clips = shmloader.VideoClips(paths, clip_len=4, size=(32, 40))
    out = []
    with shmloader.Loader(clips, batch_size=4, workers=1, drop_remainder=True) as loader:
        for batch in shmloader.jax.batches(loader, sharding):
            video = batch["video"]
            out.append({"devices": sorted(str(s.device) for s in video.addressable_shards),
                        "rows": [s.data.shape[0] for s in video.addressable_shards],
                        "index": np.asarray(batch["index"]).tolist(),
                        "index_shards": [np.asarray(s.data).tolist() for s in batch["index"].addressable_shards]})
    print(json.dumps({"n_devices": len(devices), "batches": out}))
""")


def test_sharding_splits_the_batch_over_local_devices(videos):
    paths, _ = videos
    result = run_child(TWO_DEVICES, json.dumps(paths), env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert result["n_devices"] == 2 and len(result["batches"]) == 2
    for b in result["batches"]:
        assert len(set(b["devices"])) == 2 and b["rows"] == [2, 2]  # half the batch on each device
        assert b["index_shards"][0] + b["index_shards"][1] == b["index"]
    assert sorted(i for b in result["batches"] for i in b["index"]) == list(range(8))


PROCESS = textwrap.dedent("""
    import json, sys
    import jax
    port, pid, paths = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import shmloader, shmloader.jax

    clips = shmloader.VideoClips(paths, clip_len=4, clips_per_video=2, sampling="uniform", size=(32, 40))
    seen = []
    with shmloader.Loader(clips, batch_size=2, workers=1, shuffle=True, seed=5, drop_remainder=True) as loader:
        for batch in shmloader.jax.batches(loader):  # the shard comes from jax.process_index()
            seen += [[int(i), int(s)] for i, s in zip(batch["index"], batch["start"])]
    print(json.dumps({"seen": seen, "index": jax.process_index(), "count": jax.process_count()}))
    jax.distributed.shutdown()
""")


def test_two_processes_get_disjoint_complete_shards(videos):
    paths, _ = videos
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda pid: run_child(PROCESS, str(port), str(pid), json.dumps(paths)), range(2))
    assert (a["index"], a["count"], b["index"], b["count"]) == (0, 2, 1, 2)
    mine = [{tuple(x) for x in r["seen"]} for r in (a, b)]
    every_clip = {(v, c * (40 - 4)) for v in range(len(paths)) for c in range(2)}
    assert len(a["seen"]) == len(b["seen"]) == 8
    assert mine[0].isdisjoint(mine[1]) and mine[0] | mine[1] == every_clip


def test_import_error_names_the_extra():
    script = textwrap.dedent("""
        import json, sys
        sys.modules["jax"] = None  # as if JAX were not installed
        try:
            import shmloader.jax
        except ImportError as e:
            print(json.dumps(str(e)))
    """)
    assert "pip install './shmloader[jax]'" in run_child(script)
