"""Samples of several sizes (NOTE [ Samples of several sizes ] in shmloader.engine.source): fields of
rows packed end to end in a slot beside their offsets, batches cut by a budget (``batch_tokens``),
every sample once an epoch, resume, skips, and the adapters (torch, tf.data), through real workers."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.engine.source import Sizes

from ._needs import need

pytestmark = pytest.mark.timeout(120)


class Ragged:
    """Sample ``i``: ``rows[i]`` rows of ``x`` (each ``[3]``, filled with ``i``), twice as many
    entries of ``t`` (``i * 100 + k``), its ``id``; costs ``rows[i]``. ``bad``: samples that raise."""

    def __init__(self, n: int = 23, bad: tuple[int, ...] = ()) -> None:
        self.rows = np.array([(i * 7) % 5 + 1 for i in range(n)], np.int64)
        self.bad = set(bad)

    def __len__(self) -> int:
        return len(self.rows)

    def spec(self):
        return {"x": ((-1, 3), np.uint8), "t": ((-1,), np.float32), "id": ((), np.int64)}

    def sizes(self) -> Sizes:
        return Sizes(rows={"x": self.rows, "t": 2 * self.rows}, cost=self.rows)

    def describe(self, i: int) -> str:
        return f"item-{i}"

    def worker_init(self) -> None:
        pass

    def read(self, i, rng, out) -> None:
        if i in self.bad:
            raise ValueError("unreadable")
        assert out["x"].shape == (self.rows[i], 3) and out["t"].shape == (2 * self.rows[i],)
        out["x"][:] = i
        out["t"][:] = i * 100 + np.arange(2 * self.rows[i])
        out["id"][...] = i


def check_batch(src: Ragged, batch, budget: int | None = None) -> list[int]:
    """Each sample's rows where its offsets say, whole; returns the batch's ids."""
    ids = [int(i) for i in batch["id"]]
    for name, per in (("x", 1), ("t", 2)):
        offsets = np.asarray(batch[f"{name}_offsets"])
        assert offsets.shape == (len(ids) + 1,) and offsets[0] == 0 and offsets[-1] == len(batch[name])
        for k, i in enumerate(ids):
            assert offsets[k + 1] - offsets[k] == per * src.rows[i]
    x, t, xo, to = (np.asarray(batch[k]) for k in ("x", "t", "x_offsets", "t_offsets"))
    for k, i in enumerate(ids):
        assert (x[xo[k] : xo[k + 1]] == i).all()
        np.testing.assert_array_equal(t[to[k] : to[k + 1]], i * 100 + np.arange(2 * src.rows[i]))
    if budget is not None:
        assert src.rows[ids].sum() <= budget
    return ids


def test_batches_cut_by_a_budget_hold_every_sample_once_an_epoch():
    src = Ragged()
    with shmloader.Loader(src, batch_tokens=7, workers=2, shuffle=True, seed=3, epochs=2) as loader:
        batches = [check_batch(src, b, budget=7) for b in loader]
    assert sorted(sum(batches, [])) == sorted(list(range(23)) * 2)
    # greedy cuts: the next sample in the epoch's order would not have fitted
    order = sum(batches, [])
    for b, after in zip(batches, batches[1:]):
        assert src.rows[b].sum() + src.rows[after[0]] > 7 or len(b) == loader.batch_size
    # the order is the seeded shuffle, the same with one worker
    with shmloader.Loader(src, batch_tokens=7, workers=1, shuffle=True, seed=3, epochs=2) as loader:
        assert sum((check_batch(src, b) for b in loader), []) == order


def test_batch_size_caps_a_budgeted_batch_and_the_ring_is_sized_from_the_budget():
    src = Ragged(40)
    with shmloader.Loader(src, batch_tokens=9, batch_size=2, workers=1) as loader:
        batches = [check_batch(src, b, budget=9) for b in loader]
        assert max(map(len, batches)) == 2 and sorted(sum(batches, [])) == list(range(40))
        # the room for x: at most 9 rows (a row per unit of cost) whatever the largest samples
        assert loader.layout.capacity("x") <= 10 and loader.layout.capacity("t") <= 19
    with shmloader.Loader(src, batch_size=4, workers=1) as loader:  # by count: its 4 largest samples' rows
        assert [len(check_batch(src, b)) for b in loader] == [4] * 10
        assert loader.layout.capacity("x") == 20
        assert loader.element_spec["x"] == ((None, 3), np.dtype(np.uint8))
        assert loader.element_spec["x_offsets"] == ((None,), np.dtype(np.int64))


class Pages(Ragged):
    """``Ragged`` with rows of a page each: sample 0 holds 300 of them, the others 1 to 5."""

    def __init__(self, n: int = 12) -> None:
        super().__init__(n)
        self.rows[0] = 300

    def spec(self):
        return {"x": ((-1, 4096), np.uint8), "t": ((-1,), np.float32), "id": ((), np.int64)}

    def read(self, i, rng, out) -> None:
        out["x"][:] = i + 1
        out["t"][:] = i * 100 + np.arange(2 * self.rows[i])
        out["id"][...] = i


def ring_bytes() -> int:
    """The bytes this process's ring segment has taken (pages allocated, not its size)."""
    sizes = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:shmloader"):
                st = os.fstat(int(fd))
                sizes[st.st_dev, st.st_ino] = st.st_blocks * 512
        except OSError:
            pass
    assert len(sizes) == 1, sizes
    return next(iter(sizes.values()))


def test_the_ring_holds_its_batches_rows_not_slots_times_the_largest():
    """Slots have room for the 1.2 MB sample; the ring takes what the batches in it hold, pages
    given back and taken again as small and large samples pass through a slot, rows intact."""
    src = Pages()
    with shmloader.Loader(src, batch_size=1, workers=2, slots=6, shuffle=True, seed=1, epochs=4) as loader:
        room = loader.layout.slot_bytes * 6
        taken, ids = [], []
        for batch in loader:
            ids += [int(i) for i in batch["id"]]
            x = np.asarray(batch["x"])
            assert len(x) == src.rows[ids[-1]] and (x == ids[-1] + 1).all()
            np.testing.assert_array_equal(batch["t"], ids[-1] * 100 + np.arange(2 * src.rows[ids[-1]]))
            taken.append(ring_bytes())
    assert sorted(ids) == sorted(list(range(12)) * 4)
    assert max(taken) >= 300 * 4096  # the large sample's pages were there while it was in the ring
    assert max(taken) < room / 2, (max(taken), room)  # never all slots at its size


def test_resume_mid_epoch_gives_the_rest_of_the_stream():
    src = Ragged()
    kw = dict(batch_tokens=6, workers=1, shuffle=True, seed=5, epochs=2)
    with shmloader.Loader(src, **kw) as loader:
        whole = [check_batch(src, b) for b in loader]
    first_epoch = loader._plan.batches_per_epoch(0)
    for cut in (3, first_epoch, first_epoch + 2):
        with shmloader.Loader(src, **kw) as loader:
            it = iter(loader)
            head = [check_batch(src, next(it)) for _ in range(cut)]
            state = loader.state()
        assert state["batch_tokens"] == 6
        with shmloader.Loader(src, **kw, state=state) as resumed:
            assert head + [check_batch(src, b) for b in resumed] == whole, cut
    with pytest.raises(ValueError, match="batch_tokens"):
        shmloader.Loader(src, batch_tokens=5, workers=1, shuffle=True, seed=5, state=state)


def test_a_resume_refused_names_batch_tokens_not_a_batch_size_never_set():
    """With batch_tokens= and no batch_size=, the loader's cap on samples per batch is the budget's:
    a state it refuses names that, not "batch_size=20 (now 19)"; a batch_size given is named."""
    def refusal(saved: Ragged, now: Ragged, saved_kw: dict, now_kw: dict | None = None) -> str:
        with shmloader.Loader(saved, workers=1, **saved_kw) as loader:
            next(iter(loader))
            state = loader.state()
        with pytest.raises(shmloader.StateError) as caught:
            shmloader.Loader(now, workers=1, state=state, **(now_kw or saved_kw))
        return str(caught.value)

    message = refusal(Ragged(20), Ragged(19), dict(batch_tokens=100))
    assert "batch_size" not in message, message
    assert message.endswith("here: num_samples=20 (now 19), the most samples a batch holds, as many as "
                            "batch_tokens lets the cheapest samples fill: 20 (now 19)"), message
    message = refusal(Ragged(20), Ragged(20), dict(batch_tokens=100), dict(batch_tokens=15))
    assert "batch_size" not in message and "batch_tokens=100 (now 15), the most samples" in message, message
    assert refusal(Ragged(20), Ragged(20), dict(batch_tokens=100, batch_size=3),
                   dict(batch_tokens=100, batch_size=4)).endswith("here: batch_size=3 (now 4)")


def test_a_skipped_sample_leaves_its_batch_shorter_and_the_rest_in_place():
    src = Ragged(bad=(4, 9))
    with shmloader.Loader(src, batch_tokens=7, workers=2, shuffle=True, seed=3, on_error="skip") as loader:
        got = sum((check_batch(src, b, budget=7) for b in loader), [])
    assert sorted(got) == [i for i in range(23) if i not in (4, 9)]
    assert sorted(s for _, s, _ in loader.skipped) == [4, 9]


def test_a_sample_over_the_budget_is_refused_by_name():
    src = Ragged()
    with pytest.raises(ValueError, match=r"5 samples cost more than batch_tokens=4 alone: sample 2 \(item-2\) costs 5; .* and 2 more"):
        shmloader.Loader(src, batch_tokens=4, workers=1)
    with pytest.raises(ValueError, match=r"^1 sample costs more than batch_tokens=4 alone: sample 2 \(item-2\) costs 5\. "):
        shmloader.Loader(Ragged(3), batch_tokens=4, workers=1)
    with pytest.raises(ValueError, match="one shape"):
        shmloader.Loader(shmloader.ArraySource({"a": np.zeros((4, 2))}), batch_tokens=4)
    with pytest.raises(ValueError, match="grouped|drop_remainder"):
        shmloader.Loader(src, batch_tokens=8, drop_remainder=True)
    with pytest.raises(ValueError, match="transform"):
        shmloader.Loader(src, batch_size=2, transform=lambda s, r: None)


def test_torch_tensors_over_the_slot_and_pinned_copies():
    torch = need("torch")
    src = Ragged()
    with shmloader.Loader(src, batch_tokens=7, workers=2, epochs=None) as loader:
        ring = loader.as_torch()
        batch = next(iter(ring))
        assert isinstance(batch["x"], torch.Tensor) and loader._ring.contains(batch["x"].data_ptr())
        check_batch(src, {k: v.numpy() for k, v in batch.items()})
        del batch, ring
        with warnings.catch_warnings():  # without CUDA: ordinary host buffers, said in a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            pinned = loader.as_torch(pin_memory=True)  # the pin thread's copies, laid out as the slot
        got = [check_batch(src, {k: v.numpy() for k, v in b.items()}) for _, b in zip(range(6), pinned)]
        pinned.close()
    assert len(sum(got, [])) >= 6


def test_tf_data_gives_ragged_rows_by_their_offsets():
    tf = need("tensorflow")
    src = Ragged()
    with shmloader.Loader(src, batch_tokens=7, workers=2) as loader:
        ids = []
        for batch in loader.as_dataset():
            ragged = tf.RaggedTensor.from_row_splits(batch["x"], batch["x_offsets"])
            for k, i in enumerate(batch["id"].numpy()):
                assert ragged[k].shape[0] == src.rows[i] and bool(tf.reduce_all(ragged[k] == i))
            ids += batch["id"].numpy().tolist()
    assert sorted(ids) == list(range(23))


def test_jax_pads_to_a_few_static_shapes_with_a_mask():
    jax = need("jax")
    from shmloader.jax import batches

    src = Ragged(60)
    with shmloader.Loader(src, batch_tokens=9, workers=2, shuffle=True, seed=1) as loader:
        shapes, ids = set(), []
        room = loader.layout.capacity("x")
        for batch in batches(loader, levels=3):
            assert isinstance(batch["x"], jax.Array)
            b = {k: np.asarray(v) for k, v in batch.items()}
            mask = b.pop("sample_mask")
            assert mask.shape == (loader.batch_size,) and b["id"].shape == (loader.batch_size,)
            n = int(mask.sum())
            assert mask[:n].all() and not mask[n:].any()
            real = {k: (v[: n + 1] if k.endswith("_offsets") else v if k in ("x", "t") else v[:n]) for k, v in b.items()}
            ids += check_batch(src, {**real, "x": real["x"][: real["x_offsets"][-1]],
                                     "t": real["t"][: real["t_offsets"][-1]]}, budget=9)
            assert (b["x_offsets"][n:] == b["x_offsets"][n]).all()  # padding samples hold no rows
            assert len(b["x"]) in {-(-room // 2**k) for k in range(3)}
            shapes.add((b["x"].shape, b["t"].shape))
    assert sorted(ids) == list(range(60)) and len(shapes) <= 3 * 3


def test_an_evaluation_loader_cuts_by_a_budget_in_order():
    src = Ragged()
    with shmloader.eval_loader(src, batch_tokens=7) as loader:
        got = [check_batch(src, b, budget=7) for b in loader]
    assert sum(got, []) == list(range(23))
