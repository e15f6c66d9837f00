"""The PyTorch adapter: ``loader.as_torch()``. The only module that imports torch.

NOTE [ Tensors and the slot lease ]
``torch.from_numpy`` keeps a reference to the numpy array it wraps for as long as the tensor's
storage lives, and every view of the tensor shares that storage. So a tensor made from a slot
view holds the slot's lease (NOTE [ Slot lease ] in ``engine.ring``) exactly as the numpy view does:
the slot is written again only when every tensor of the batch, and every view of one, is gone.
The pin-memory thread's host buffers follow the same rule: each hand-out is a fresh numpy array
over a reused buffer, returned (``engine.ring.Returns``) when it dies, and the tensors wrap views
of it. A non-blocking copy to CUDA reads its pinned source after ``to()`` returns, so the source
batch is kept until an event recorded after the copy has completed.
"""

from __future__ import annotations

import queue
import threading
import warnings
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterator, Union, cast

import numpy as np

from ._errors import install_hint

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised in a child interpreter by the tests
    raise ImportError(f"shmloader.torch needs PyTorch: {install_hint('torch')} (torch>=2.3; on a "
                      "machine without a GPU, its CPU build from PyTorch's CPU index)") from e

from ._errors import LoaderError
from .engine.ring import Layout, Returns

if TYPE_CHECKING:
    from ._batches import Batches

__all__ = ["TorchLoader", "as_torch"]

# Batches the pin-memory thread copies ahead of the consumer (torch DataLoader's default
# prefetch_factor is 2 batches per worker): enough to hide one copy behind a training step.
_PIN_DEPTH = 2
# Host buffers kept for reuse beyond what is in flight: the batch in the consumer's hands and the
# one the thread fills. More are allocated only while the consumer keeps more batches alive.
_SPARE_BUFFERS = 2
# How often a blocked pin thread or consumer looks at the stop signal and at the other side.
_POLL_S = 0.1
# How long close() waits for the pin thread, which may be inside the loader waiting for a batch.
_JOIN_S = 5.0


def as_torch(loader: Batches, pin_memory: bool = False, device: Any = None,
             shard: tuple[int, int] | None = None) -> TorchLoader:
    """Wrap ``loader`` so that iterating yields dicts of ``torch.Tensor`` (see ``TorchLoader``)."""
    return TorchLoader(loader, pin_memory=pin_memory, device=device, shard=shard)


class TorchLoader:
    """Batches of a ``shmloader.Loader`` as dicts of ``torch.Tensor``.

    - ``pin_memory=False``: ``torch.from_numpy`` over the ring's slots, no copy; a slot is reused
      only when every tensor of its batch is gone (NOTE [ Tensors and the slot lease ]).
    - ``pin_memory=True``: a background thread copies each batch into reused host buffers,
      page-locked when CUDA is present, as torch DataLoader's pin-memory thread does; the ring
      slot is free again as soon as its batch is copied.
    - ``device``: tensors are copied there (``non_blocking`` on CUDA).
    - ``shard``: ``(rank, world_size)`` to serve; by default ``torch.distributed``'s rank and world
      size when a process group is initialised (DDP), else the loader's own shard.
    - ``state_dict()`` / ``load_state_dict()`` as torchdata's ``StatefulDataLoader`` names them;
      the state counts the batches this object handed to you, not those the thread prefetched.

    Iterating again after a finished pass runs the loader's next pass; an iteration left early
    is continued by the next one (the pin thread keeps what it prefetched).
    """

    def __init__(self, loader: Batches, *, pin_memory: bool = False, device: Any = None,
                 shard: tuple[int, int] | None = None) -> None:
        self._loader = loader
        self._device = _check_device(device)
        if shard is None:
            shard = _distributed_shard()
        if shard is not None:
            rank, world = shard
            loader.set_shard(int(rank), int(world))
        self._pinned = bool(pin_memory) and torch.cuda.is_available()
        if pin_memory and not self._pinned:
            warnings.warn("pin_memory=True but CUDA is not available: the pin-memory thread copies "
                          "batches into ordinary host buffers", RuntimeWarning, stacklevel=4)
        self._pin_memory = bool(pin_memory)
        self._pin: _PinThread | None = None
        self._in_pass = False
        self._base = loader.stats()["batches"]  # delivered before this adapter existed
        self._yielded = 0
        self._inflight: deque[tuple[Any, dict[str, torch.Tensor]]] = deque()  # (CUDA event, host batch being copied)

    # ----------------------------------------------------------------- public
    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._batches(self._take_pinned if self._pin_memory else self._ring_taker())

    def __enter__(self) -> "TorchLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def loader(self) -> Batches:
        return self._loader

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands after the batches handed to you: ``Loader.state()``'s dict
        (JSON-serialisable), for ``load_state_dict`` or ``Loader(..., state=)``."""
        return self._loader.state(consumed=self._base + self._yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (a ``state_dict()``): the next batches are exactly those an
        uninterrupted run would have delivered. Only before the first batch."""
        if self._pin is not None or self._yielded or self._loader.stats()["batches"]:
            raise LoaderError("load_state_dict() must come before the first batch")
        self._loader.load_state(state)
        self._base = 0

    def close(self) -> None:
        """Stop the pin-memory thread and wait for copies in flight. The loader stays open (close
        it, or leave its ``with`` block, as usual). Idempotent."""
        if self._pin is not None:
            self._pin.shutdown()
        self._sync()

    # --------------------------------------------------------------- iterating
    def _batches(self, take: Callable[[], dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
        try:
            while True:
                # No local keeps a batch while the generator is suspended: its slot (or host
                # buffer) comes back as soon as you drop its tensors.
                yield self._to_device(take())
        except _Done:
            return

    def _ring_taker(self) -> Callable[[], dict[str, torch.Tensor]]:
        batches = iter(self._loader)

        def take() -> dict[str, torch.Tensor]:
            batch = next(batches, None)
            if batch is None:
                raise _Done
            self._yielded += 1
            return {name: _tensor(view) for name, view in batch.items()}

        return take

    def _take_pinned(self) -> dict[str, torch.Tensor]:
        if self._pin is None:
            self._pin = _PinThread(self._loader, _HostBuffers(self._loader, self._pinned))
            weakref.finalize(self, self._pin.shutdown)
        if not self._in_pass:
            self._pin.request_pass()
            self._in_pass = True
        item = self._pin.get()
        if isinstance(item, _End):
            self._in_pass = False
            raise _Done
        if isinstance(item, _Failure):
            self._in_pass = False
            raise item.error
        self._yielded += 1
        return item

    def _to_device(self, host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        dev = self._device
        if dev is None or dev.type == "cpu":
            return host
        if dev.type != "cuda":
            return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in host.items()}
        out = {k: v.to(dev, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in host.items()}
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(dev))
        self._inflight.append((event, host))  # the source must outlive the copy: see the NOTE
        while self._inflight and self._inflight[0][0].query():
            self._inflight.popleft()
        return out

    def _sync(self) -> None:
        while self._inflight:
            self._inflight.popleft()[0].synchronize()


def _check_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available to this torch "
                         f"({torch.__version__}); pass device=None to keep batches on the host")
    return dev


def _distributed_shard() -> tuple[int, int] | None:
    """(rank, world size) of the default process group, when one with several ranks exists."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


class _Done(Exception):
    """The loader's pass is over: iteration ends."""


# ------------------------------------------------------------------ pinning
class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _End:
    """The pass is over (what the thread puts after the last batch)."""


_END = _End()
_Item = Union[dict[str, torch.Tensor], _End, _Failure]  # what the pin thread hands over


class _HostBuffers:
    """Whole-batch host buffers, reused once every tensor of a hand-out is gone.

    A buffer is a uint8 torch tensor (page-locked when ``pinned``) seen through a memoryview, so
    that each hand-out can be a fresh ``np.frombuffer`` array: numpy then keeps that array as the
    ``base`` of the field views, and its finalizer fires only when the last of them dies.
    """

    def __init__(self, loader: Batches, pinned: bool) -> None:
        layout = getattr(loader, "layout", None)  # a Loader's own: fields of rows keep their room
        if layout is None:
            spec = {name: (tuple(int(d) for d in shape[1:] if d is not None), dtype)
                    for name, (shape, dtype) in loader.element_spec.items()}
            layout = Layout.build(spec, loader.batch_size)
        self._layout = layout
        self._pinned = pinned
        self._lent = Returns()  # buffers come back from whatever thread drops their last tensor
        self._free: list[memoryview] = []
        self.allocated = 0

    def fill(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        self._free.extend(self._lent.returned())
        del self._free[_PIN_DEPTH + _SPARE_BUFFERS :]  # what a consumer kept and let go is freed
        # None free: the consumer holds them all. A new buffer (not a wait) keeps a consumer that
        # keeps batches from deadlocking; memory grows only by what it keeps.
        mem = self._free.pop() if self._free else self._allocate()
        base = np.frombuffer(mem, np.uint8)
        # Each array at its field's place in the buffer, in the batch's own shape (a field of rows
        # holds this batch's rows; a bucketed source's, its bucket's shape: within the room).
        at = {f.name: f for f in self._layout.fields}
        out: dict[str, Any] = {}
        for name, a in batch.items():
            if a.dtype == object:  # str from the main process (captions): a list
                out[name] = a.tolist()
                continue
            f = at[name]
            if a.nbytes > f.nbytes:
                raise ValueError(f"batch field {name!r} of {a.nbytes} bytes does not fit its room ({f.nbytes})")
            view = base[f.offset : f.offset + a.nbytes].view(a.dtype).reshape(a.shape)
            np.copyto(view, a)
            out[name] = torch.from_numpy(view)
        self._lent.watch(base, mem)
        del base
        return out

    def _allocate(self) -> memoryview:
        buf = torch.empty(self._layout.slot_bytes, dtype=torch.uint8, pin_memory=self._pinned)
        self.allocated += 1
        # keeps buf (and its pinned block) alive; Any: torch's stubs type numpy() otherwise per version
        return memoryview(cast(Any, buf.numpy()))


def _tensor(a: np.ndarray) -> Any:
    """A batch's field as torch takes it: a tensor over the array, or a list of str (captions)."""
    return a.tolist() if a.dtype == object else torch.from_numpy(a)


class _PinThread:
    """Copies the loader's batches into host buffers ahead of the consumer, one pass at a time.

    The thread is the loader's only consumer while it lives. It starts a pass when asked (never
    runs into the next pass on its own: a pass may mean an evaluation), hands over what it copied
    through a bounded queue, and ends on ``shutdown()``, when the loader is closed, or with the
    process (daemon). Errors travel to the consumer as they were raised.
    """

    def __init__(self, loader: Batches, buffers: _HostBuffers) -> None:
        self.buffers = buffers
        self.out: queue.Queue[_Item] = queue.Queue(maxsize=_PIN_DEPTH)
        self._requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_pin_loop, name="shmloader-pin-memory", daemon=True,
                                        args=(loader, buffers, self.out, self._requests, self._stop))
        self._thread.start()

    def request_pass(self) -> None:
        self._requests.put(True)

    def get(self) -> _Item:
        while True:
            try:
                return self.out.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self.out.empty():
                    raise LoaderError("the pin-memory thread has stopped") from None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self) -> None:
        self._stop.set()
        while True:  # what it prefetched goes back to the buffers (and a blocked put returns)
            try:
                self.out.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)


def _pin_loop(loader: Batches, buffers: _HostBuffers, out: queue.Queue[_Item], requests: queue.SimpleQueue[bool],
              stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            requests.get(timeout=_POLL_S)
        except queue.Empty:
            if loader.closed:
                return
            continue
        try:
            for batch in loader:
                item = buffers.fill(batch)
                del batch  # the ring slot is free again once copied
                if not _put(out, item, stop):
                    return
                del item
            end: _Item = _END
        except BaseException as e:  # the consumer raises it, with its cause and traceback
            end = _Failure(e)
        if not _put(out, end, stop):
            return


def _put(out: queue.Queue[_Item], item: _Item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            pass
    return False
