"""The shared-memory ring: ``slots`` whole-batch buffers in one anonymous segment.

The main process creates the segment and is its only owner; workers attach to the file
descriptor they inherit and never create or free anything. The segment has no name
(``memfd_create``, or ``O_TMPFILE`` inside a directory the user picks), so nothing is left in
``/dev/shm`` whatever kills us; its pages are reserved by the main process before any worker
writes them, so that a small shared-memory mount fails with a clear error instead of raising
SIGBUS on first touch.

NOTE [ Slots of several sizes ]
A slot of samples of several sizes (fields of rows) has room for the largest batch the plan can
make, while most batches are smaller: whole videos range from seconds to an hour. Its pages are
therefore reserved batch by batch (``Ring.fit``, when the main process writes a batch's offsets,
before any task goes out): each field of rows is backed up to the rows this batch holds, and the
pages past them are given back (``MADV_REMOVE``), so the ring takes what its batches in flight
hold rather than slots times the largest. A batch larger than the slot's last costs the kernel
zeroing its new pages once (a few ms for tens of MB); fields of a fixed size stay reserved from
the start.

NOTE [ Slot lease ]
TensorFlow does not copy the arrays a ``from_generator`` generator yields: the tensor aliases
the slot and TF keeps a reference to the array while the tensor lives. So a slot is free
again only when every array handed out for it has been released, never merely at the next
``yield``. Each hand-out builds a fresh ``uint8`` array over the slot (the *lease*); the field
arrays are views whose ``base`` is that lease. A weak reference to the lease (``Returns``)
returns the slot when it dies: CPython calls ``SimpleQueue.put`` with the reference, on
whatever thread dropped the last array (TF's, or the garbage collector's). That callback is C
code only, and it must be: a signal handler runs between Python instructions, so a Ctrl-C
landing inside a Python finalizer raises KeyboardInterrupt there, where CPython prints it as
"Exception ignored" and drops it (and the slot with it) - the training script goes on. The
engine moves returned slots back to its free list on its own thread, each time round its loop
(NOTE [ The engine loop ] in ``engine.core``); nothing wakes it, so when workers idle for want of a
slot while the consumer holds leases it polls the queue. The loader never hands out its last
unleased slot: when the consumer already holds all the others, that batch is copied instead,
so a consumer that hoards batches can neither deadlock the pipeline nor see data overwritten.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import queue
import resource
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from .._errors import LoaderError

__all__ = ["Field", "Layout", "Returns", "Ring", "attach_views", "memory_for_ring", "rows_capacity"]

# Every field starts on a 64-byte boundary (cache line, AVX-512 loads); slots start on a page.
_ALIGN = 64
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    shape: tuple[int, ...]  # per sample; per row for a field of rows
    dtype: np.dtype
    offset: int  # within a slot
    nbytes: int  # for a whole batch
    offsets: str = ""  # a field of rows: the name of its offsets field (NOTE [ Samples of several sizes ])
    is_offsets: bool = False  # int64 [batch_size + 1], where each sample's rows start


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each field of a batch lives inside a slot."""

    batch_size: int
    fields: tuple[Field, ...]
    slot_bytes: int

    @classmethod
    def build(cls, spec: dict[str, tuple[tuple[int, ...], np.dtype]], batch_size: int,
              capacity: dict[str, int] | None = None) -> "Layout":
        """``capacity``: the rows a batch may hold of each field of rows (first dimension -1 in
        ``spec``), beside which an ``<name>_offsets`` field is laid out."""
        fields, offset = [], 0

        def add(name: str, shape: tuple[int, ...], dtype: np.dtype, nbytes: int, **kind: Any) -> None:
            nonlocal offset
            fields.append(Field(name, shape, dtype, offset, nbytes, **kind))
            offset += -(-nbytes // _ALIGN) * _ALIGN

        for name, (shape, dtype) in spec.items():
            dtype = np.dtype(dtype)
            shape = tuple(int(s) for s in shape)
            if shape[:1] == (-1,):
                offsets = f"{name}_offsets"
                if offsets in spec:
                    raise ValueError(f"field {offsets!r} clashes with the offsets of field of rows {name!r}")
                add(offsets, (), np.dtype(np.int64), (batch_size + 1) * 8, is_offsets=True)
                rows = (capacity or {}).get(name, 0)
                add(name, shape[1:], dtype, rows * math.prod(shape[1:]) * dtype.itemsize, offsets=offsets)
            else:
                add(name, shape, dtype, batch_size * math.prod(shape) * dtype.itemsize)
        slot_bytes = max(_PAGE, -(-offset // _PAGE) * _PAGE)
        return cls(batch_size, tuple(fields), slot_bytes)

    @property
    def has_rows(self) -> bool:
        return any(f.offsets for f in self.fields)

    def capacity(self, name: str) -> int:
        """The rows a batch may hold of field of rows ``name``."""
        f = next(f for f in self.fields if f.name == name)
        return f.nbytes // max(1, math.prod(f.shape) * f.dtype.itemsize)

    def place(self, views: dict[str, np.ndarray], rows: dict[str, np.ndarray]) -> None:
        """Write the offsets of a batch whose samples hold ``rows[field]`` rows each, into a slot's
        whole ``views``."""
        for f in self.fields:
            if f.offsets:
                offsets = views[f.offsets]
                offsets[0] = 0
                np.cumsum(rows[f.name], out=offsets[1 : len(rows[f.name]) + 1])

    def compact(self, views: dict[str, np.ndarray], valid: list[int], count: int) -> None:
        """Close the holes of a slot's batch of ``count`` samples that keeps positions ``valid``:
        they move to the front, and each field of rows' kept rows with them (offsets rewritten)."""
        moved = set()
        for f in self.fields:
            if f.offsets:
                arr, offsets = views[f.name], views[f.offsets]
                sizes = np.diff(offsets[: count + 1])[valid]
                at = 0
                for src, size in zip(valid, sizes.tolist()):
                    arr[at : at + size] = arr[offsets[src] : offsets[src] + size]  # forward only: at <= start
                    at += size
                offsets[1 : len(valid) + 1] = np.cumsum(sizes)
                moved |= {f.name, f.offsets}
        for dst, src in enumerate(valid):
            if dst != src:
                for name, arr in views.items():
                    if name not in moved:
                        arr[dst] = arr[src]

    def views(self, buf: np.ndarray, n: int | None = None) -> dict[str, np.ndarray]:
        """Field arrays (leading batch axis, the first ``n`` samples) over one slot's ``uint8``
        buffer. A field of rows holds the rows of those ``n`` samples, as its offsets in the
        slot say (``n=None``: the whole room, and offsets ``[batch_size + 1]``)."""
        out: dict[str, np.ndarray] = {}
        for f in self.fields:
            if f.is_offsets:
                out[f.name] = buf[f.offset : f.offset + f.nbytes].view(np.int64)[: None if n is None else n + 1]
            elif f.offsets:
                row = math.prod(f.shape) * f.dtype.itemsize
                rows = f.nbytes // max(1, row) if n is None else int(out[f.offsets][n])
                out[f.name] = buf[f.offset : f.offset + rows * row].view(f.dtype).reshape((rows, *f.shape))
            else:
                m = self.batch_size if n is None else n
                out[f.name] = buf[f.offset : f.offset + f.nbytes * m // self.batch_size].view(f.dtype).reshape(
                    (m, *f.shape))
        return out


def rows_capacity(sizes: Any, batch_size: int, budget: int | None) -> dict[str, int]:
    """The rows a batch may hold of each field: its ``batch_size`` largest samples', and within a
    budget at most the budget times the most rows a sample has per unit of cost."""
    out = {}
    for name, rows in sizes.rows.items():
        most = int(np.sort(rows)[::-1][:batch_size].sum())
        if budget is not None:
            ratio = float(np.max(rows / np.maximum(sizes.cost, 1), initial=0.0))
            most = min(most, int(budget * ratio) + 1)
        out[name] = most
    return out


def _row_bytes(f: Field) -> int:
    return math.prod(f.shape) * f.dtype.itemsize


def _fixed_ranges(layout: Layout) -> list[tuple[int, int]]:
    """(offset, length) within a slot of everything but its fields of rows: reserved up front."""
    out, at = [], 0
    for f in sorted((f for f in layout.fields if f.offsets), key=lambda f: f.offset):
        if f.offset > at:
            out.append((at, f.offset - at))
        at = max(at, f.offset + f.nbytes)
    if layout.slot_bytes > at:
        out.append((at, layout.slot_bytes - at))
    return out


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges with those that touch made one."""
    out: list[tuple[int, int]] = []
    for offset, length in ranges:
        if out and out[-1][0] + out[-1][1] == offset:
            out[-1] = (out[-1][0], out[-1][1] + length)
        else:
            out.append((offset, length))
    return out


def _available_memory() -> int:
    """The memory available now: the one figure both checks below read (a test pins it)."""
    return psutil.virtual_memory().available


def memory_for_ring(shm_dir: str | None) -> int:
    """Bytes a new ring could take: the available memory, and at most the free space of
    ``shm_dir`` when the ring goes there (a ``memfd`` is not limited by any mount's size)."""
    available = _available_memory()
    if shm_dir is not None and os.path.isdir(shm_dir):
        st = os.statvfs(shm_dir)
        available = min(available, st.f_bavail * st.f_frsize)
    return available


def _create_segment(nbytes: int, shm_dir: str | None, reserve: list[tuple[int, int]]) -> int:
    """The segment, ``reserve``'s (offset, length) ranges reserved."""
    available = _available_memory()
    if nbytes > available:
        raise LoaderError(f"the ring needs {nbytes / 2**30:.2f} GiB but only {available / 2**30:.2f} GiB "
                          "of memory is available: use fewer slots or a smaller batch or clip")
    if shm_dir is None:
        fd = os.memfd_create("shmloader", os.MFD_CLOEXEC)
    else:
        if not os.path.isdir(shm_dir):
            raise ValueError(f"shm_dir {shm_dir!r} is not a directory")
        fd = os.open(shm_dir, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # ours alone, even through /proc/<pid>/fd
        os.ftruncate(fd, nbytes)
        for offset, length in reserve:
            os.posix_fallocate(fd, offset, length)  # ftruncate reserves nothing: see module docstring
    except OSError as e:
        os.close(fd)
        raise _no_room(e, shm_dir, f"the ring needs {nbytes / 2**20:.1f} MiB") from e
    except BaseException:
        os.close(fd)
        raise
    return fd


def _no_room(e: OSError, shm_dir: str | None, need: str) -> Exception:
    """What to raise for ``e`` met reserving pages: a LoaderError in words where there was no room."""
    if e.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
        return e
    where = "memory for shared segments" if shm_dir is None else f"space in {shm_dir}"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if e.errno == errno.EFBIG and limit != resource.RLIM_INFINITY:
        # A file size limit (ulimit -f) applies to memfd and tmpfs files too.
        where += f" under this process's file size limit (ulimit -f: {limit / 2**20:.1f} MiB)"
    return LoaderError(f"not enough {where}: {need} ({os.strerror(e.errno)}). Use fewer slots or a smaller "
                       "batch, or give the container more shared memory (docker run --shm-size=...)")


class Ring:
    """Owner side of the ring. Only the main process creates one."""

    def __init__(self, layout: Layout, slots: int, shm_dir: str | None = None) -> None:
        self.layout = layout
        self.slots = slots
        self.nbytes = layout.slot_bytes * slots
        self._shm_dir = shm_dir
        # NOTE [ Slots of several sizes ]: fields of rows are reserved batch by batch (fit).
        self._rows = [f for f in layout.fields if f.offsets]
        self._backed = [[0] * len(self._rows) for _ in range(slots)]  # bytes reserved per slot, field
        fixed = _fixed_ranges(layout)
        self.fd = _create_segment(self.nbytes, shm_dir, _merged([(s * layout.slot_bytes + a, n) for s in range(slots)
                                                                 for a, n in fixed]))
        self._mm: mmap.mmap | None = mmap.mmap(self.fd, self.nbytes)
        whole = np.frombuffer(self._mm, np.uint8)
        self.address = whole.ctypes.data
        # The loader's own (unleased) buffer and views of each slot, for offsets, compaction and copies.
        self.slot_bufs = [whole[s * layout.slot_bytes : (s + 1) * layout.slot_bytes] for s in range(slots)]
        self.slot_views = [layout.views(buf) for buf in self.slot_bufs]
        del whole
        self._leases = Returns()

    def fit(self, slot: int, n: int) -> None:
        """Back each field of rows of ``slot`` up to the rows of its ``n`` samples (their offsets
        are written), giving back the pages past them (NOTE [ Slots of several sizes ])."""
        assert self._mm is not None, "the ring is closed"
        views, base = self.slot_views[slot], slot * self.layout.slot_bytes
        for i, f in enumerate(self._rows):
            need = min(f.nbytes, -(-int(views[f.offsets][n]) * _row_bytes(f) // _PAGE) * _PAGE)
            have = self._backed[slot][i]
            if need > have:
                try:
                    os.posix_fallocate(self.fd, base + f.offset + have, need - have)
                except OSError as e:
                    raise _no_room(e, self._shm_dir, f"a batch of {n} samples needs "
                                   f"{(need - have) / 2**20:.1f} MiB more for {f.name!r}") from e
            elif need < have:
                # Whole pages only: the field's first page may hold the field before it.
                start = -(-(base + f.offset + need) // _PAGE) * _PAGE
                end = (base + f.offset + have) // _PAGE * _PAGE
                if end > start:
                    self._mm.madvise(mmap.MADV_REMOVE, start, end - start)
            self._backed[slot][i] = need

    def lease(self, slot: int, n: int) -> dict[str, np.ndarray]:
        """Arrays for the first ``n`` samples of ``slot``; the slot comes back when they die.

        See NOTE [ Slot lease ].
        """
        assert self._mm is not None, "the ring is closed"
        size = self.layout.slot_bytes
        buf = np.frombuffer(self._mm, np.uint8, count=size, offset=slot * size)
        out = self.layout.views(buf, n)
        self._leases.watch(buf, slot)
        del buf
        return out

    def returned(self) -> list[int]:
        """The slots whose leases died since the last call (see NOTE [ Slot lease ])."""
        return self._leases.returned()

    @property
    def leased(self) -> int:
        """Slots leased and not yet returned."""
        return len(self._leases)

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + self.nbytes

    def close(self) -> None:
        """Close the descriptor; the mapping goes when the last leased array does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.slot_views = []
        self.slot_bufs = []
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # the consumer still holds batches: the mapping goes with the last of them
            self._mm = None


class Returns:
    """Things lent out with an array, each given back when its array dies - by C code alone, on
    whatever thread drops the array (NOTE [ Slot lease ]); collected by ``returned()``."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Ref] = queue.SimpleQueue()
        self._out: dict[int, _Ref] = {}  # by id: the weak references must live to call back

    def watch(self, array: np.ndarray, thing: Any) -> None:
        ref = _Ref(array, self._queue.put)
        ref.thing = thing
        self._out[id(ref)] = ref

    def returned(self) -> list[Any]:
        """What came back since the last call."""
        things = []
        while not self._queue.empty():
            ref = self._queue.get()
            del self._out[id(ref)]
            things.append(ref.thing)
        return things

    def __len__(self) -> int:
        """Lent out and not yet back."""
        return len(self._out) - self._queue.qsize()


class _Ref(weakref.ref):
    __slots__ = ("thing",)
    thing: Any


def attach_views(fd: int, layout: Layout, slots: int) -> list[dict[str, np.ndarray]]:
    """Worker side: map the inherited segment once and return every slot's field arrays."""
    nbytes = layout.slot_bytes * slots
    if os.fstat(fd).st_size < nbytes:
        raise LoaderError("shared segment is smaller than its layout")
    mm = mmap.mmap(fd, nbytes)
    whole = np.frombuffer(mm, np.uint8)
    return [layout.views(whole[s * layout.slot_bytes : (s + 1) * layout.slot_bytes]) for s in range(slots)]
