"""What a source is: a fixed number of samples, each a dict of arrays.

A source object is built in the main process, pickled by value to each worker, and there
asked to write sample ``index`` into preallocated arrays (views of a ring slot). The main
process never reads a sample; it only plans which index goes where. Besides the protocol
below, a source may have ``read_many`` (several samples in one call), ``fds`` (descriptors its
workers inherit), ``acquire``/``release`` (around the engine's life), ``counters`` (what a worker
counted, for ``stats()``) and ``worker_imports`` (shmloader modules its workers import, which the
fork server imports once ahead, ``engine.forkserver``).

NOTE [ Samples of several sizes ]
A field's shape is the same for every sample, except where its first dimension is ``-1``: a
field of *rows*, each sample holding its own number of them (``(-1, 1176)``: a video's patch
rows). Such a source also has ``sizes()``: every sample's row count per field, and its *cost*
(what a batch budget counts, e.g. a video-LLM's tokens), known before anything is read, so the
plan stays seeded and resumable. A batch then packs its samples' rows end to end along the
first axis, field ``f`` beside ``f_offsets`` (``[n + 1]``: sample ``i``'s rows are
``f[offsets[i]:offsets[i + 1]]``, as ``cu_seqlens`` and ``tf.RaggedTensor``'s row splits).

NOTE [ A family of samples ]
A family of samples (fixed clips, a video-LLM's planned videos, a robot dataset's timesteps, the
next one) is one folder: what to read and how it is shaped. It gives the house a *description*
(``Family``), made in the training process from probes or a manifest, that opens no reader and
pickles by value: ``__len__``, ``spec()`` (a field of rows with ``sizes()``), ``describe(i)`` (the
file and place, for errors), ``fingerprint()`` (what a saved state must match), ``for_workers()``
(the ``Source`` one loader's workers run, its tables in one shared segment: ``engine.shared``),
``reader()`` (sample ids in, new arrays out, in any process: ``read(ids, seed=, epoch=)`` and
``counters()``), and where it groups samples for one decode pass ``group_size``/``group_ids()``.
The house gives every family the rest, written once: where files live and how they are read
(``video.reading.Reading``: local files and fsspec URLs by byte range, ``storage_options``,
``fetch``, ``decoder``, ``decode_threads``; ``Reading.decoding()`` and ``Decoding.counters()``),
the decoder measured or chosen per file, files that cannot be read named together or skipped
(``on_error``), the Loader (plans, batches by count or by cost, resume checked by the
fingerprint, ``stats()``), ``eval_loader``, each framework's adapter, and Ray
(``shmloader.ray.dataset`` over ``reader()``). A family of whole videos planned one by one writes a
``Recipe`` over ``video.planned.PlannedVideos`` and nothing else (``shmloader.qwen``); one whose
samples are not whole videos writes its description, its worker source and its reader over the
house's parts (``shmloader.lerobot``). tests/test_families.py holds every family to this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

Spec = dict[str, tuple[tuple[int, ...], np.dtype]]

ROWS = -1  # a spec shape's first dimension for a field of rows (NOTE [ Samples of several sizes ])


@dataclass(frozen=True)
class Sizes:
    """Every sample's size, for sources with fields of rows (NOTE [ Samples of several sizes ]).

    ``rows``: field -> int64 ``[num_samples]`` row counts, one entry per field of rows;
    ``cost``: int64 ``[num_samples]``, what ``Loader(batch_tokens=N)`` counts against ``N``.
    """

    rows: dict[str, np.ndarray]
    cost: np.ndarray


def rows_fields(spec: Spec) -> list[str]:
    """The fields of rows of a spec (first dimension ``ROWS``)."""
    return [name for name, (shape, _) in spec.items() if shape[:1] == (ROWS,)]


def seeded(key: tuple[int, ...]) -> np.random.Generator:
    """``np.random.default_rng(key)``, the same stream, made in 8 us instead of 12. Sample ``i``
    of epoch ``e`` under ``seed`` draws from ``seeded((seed, e, i))`` wherever it is read (a ring
    worker, or a source's own reader in another process), so its clips do not depend on where."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))


class Source(Protocol):
    def __len__(self) -> int:
        """Number of samples per epoch."""

    def spec(self) -> Spec:
        """Field name -> (per-sample shape, dtype)."""

    def describe(self, index: int) -> str:
        """What sample ``index`` is, for error messages (a path, or ``index N``)."""

    def worker_init(self) -> None:
        """Called once in each worker before its first read."""

    def read(self, index: int, rng: np.random.Generator, out: dict[str, np.ndarray]) -> None:
        """Write sample ``index`` into ``out`` (arrays of exactly ``spec`` shape and dtype)."""


@runtime_checkable
class Described(Protocol):
    """A dataset described apart from what reads it (``VideoClips``): each loader asks it for the
    source its workers run, and owns that (shared tables, per-loader state)."""

    def __len__(self) -> int: ...

    def spec(self) -> Spec: ...

    def describe(self, index: int) -> str: ...

    def for_workers(self) -> Source: ...


@runtime_checkable
class Reader(Protocol):
    """A family's samples read in any process (a Ray task, a GPU decoder): ids in, new arrays out
    (NOTE [ A family of samples ])."""

    def read(self, samples: Sequence[int], *, seed: int = 0, epoch: int = 0) -> dict[str, np.ndarray]: ...

    def counters(self) -> dict[str, int]: ...


@runtime_checkable
class Family(Described, Protocol):
    """What a family of samples gives the house (NOTE [ A family of samples ])."""

    def fingerprint(self) -> str: ...

    def reader(self) -> Reader: ...


def normalize_spec(spec) -> Spec:
    """Check a user's ``{name: (shape, dtype)}`` and return it with tuple shapes and numpy dtypes."""
    if not isinstance(spec, dict) or not spec:
        raise TypeError("spec must be a non-empty dict {name: (shape, dtype)}")
    out: Spec = {}
    for name, value in spec.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"spec keys must be non-empty strings, got {name!r}")
        try:
            shape, dtype = value
            shape = tuple(int(s) for s in shape)
            dtype = np.dtype(dtype)
        except (TypeError, ValueError) as e:
            raise TypeError(f"spec[{name!r}] must be (shape, dtype), got {value!r}") from e
        if any(s < 0 for s in shape[1:]) or (shape and shape[0] < ROWS):
            raise ValueError(f"spec[{name!r}] has a negative dimension: {shape} (only the first may be "
                             f"{ROWS}: a field of rows, as many per sample as the source's sizes() say)")
        if dtype.hasobject or dtype.kind in "OUSV":
            raise TypeError(f"spec[{name!r}]: dtype {dtype} cannot live in shared memory")
        out[name] = (shape, dtype)
    return out


def check_sample(sample, spec: Spec, what: str) -> None:
    """Raise a ValueError naming ``what`` if ``sample`` does not match ``spec``."""
    if not isinstance(sample, dict):
        raise ValueError(f"{what} returned {type(sample).__name__}, expected a dict of arrays")
    if set(sample) != set(spec):
        raise ValueError(f"{what} returned keys {sorted(sample)}, spec has {sorted(spec)}")
    for name, (shape, dtype) in spec.items():
        a = np.asarray(sample[name])
        if a.shape != shape:
            raise ValueError(f"{what}: {name!r} has shape {a.shape}, spec says {shape}")
        if not np.can_cast(a.dtype, dtype, casting="same_kind"):
            raise ValueError(f"{what}: {name!r} has dtype {a.dtype}, spec says {dtype}")


def probe_transform(source: Source | Described, transform, seed: int):
    """Run ``transform`` once on a zero sample to learn what it produces.

    Returns (output spec, decode spec or None). The decode spec is set when the transform
    changes a shape or dtype: workers then decode into a private buffer and copy the result.
    """
    spec = source.spec()
    if transform is None:
        return spec, None
    if rows_fields(spec):
        raise ValueError(f"transform= works on sources whose samples have one shape; this one has fields "
                         f"of rows ({', '.join(rows_fields(spec))}): transform in the source, or on the batch")
    sample = {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}
    try:
        result = transform(dict(sample), np.random.default_rng((seed, 0, 0)))
    except Exception as e:
        raise ValueError(f"transform failed on a zero-filled sample: {type(e).__name__}: {e}") from e
    if result is None:
        return spec, None
    if not isinstance(result, dict):
        raise TypeError(f"transform must modify the sample in place and return None, or return a "
                        f"dict of arrays; it returned {type(result).__name__}")
    out = {}
    for k, v in result.items():
        a = np.asarray(v)
        if a.dtype.hasobject:
            raise TypeError(f"transform output {k!r} has dtype object")
        out[k] = (a.shape, a.dtype)
    return out, (None if out == spec else spec)


def checked_sizes(source: Source | Described, budget: int | None) -> Sizes | None:
    """The sizes of a source whose samples have several (NOTE [ Samples of several sizes ] in
    ``engine.source``), checked; None for one of one shape. A sample that alone costs more than
    ``budget`` is refused here, named."""
    fields = rows_fields(source.spec())
    if not fields:
        if budget is not None:
            raise ValueError("batch_tokens= cuts batches of samples of several sizes; every sample of this "
                             "source has one shape: use batch_size=")
        return None
    sizes: Sizes = source.sizes()  # type: ignore[union-attr]  # a source with fields of rows has it
    n = len(source)
    if sorted(sizes.rows) != sorted(fields):
        raise ValueError(f"the source's sizes() give rows of {sorted(sizes.rows)}, its spec has fields of rows "
                         f"{sorted(fields)}")
    for name, a in (*sizes.rows.items(), ("cost", sizes.cost)):
        if np.shape(a) != (n,) or (n and np.min(a) < 0):
            raise ValueError(f"the source's sizes(): {name} must be {n} counts >= 0, got shape {np.shape(a)}")
    if budget is not None:
        over = np.flatnonzero(sizes.cost > budget)
        if len(over):
            named = "; ".join(f"sample {i} ({source.describe(int(i))}) costs {int(sizes.cost[i])}" for i in over[:3])
            more = f" and {len(over) - 3} more" if len(over) > 3 else ""
            many = len(over) > 1
            raise ValueError(f"{len(over)} sample{'s' if many else ''} cost{'' if many else 's'} more than "
                             f"batch_tokens={budget} alone: {named}{more}. "
                             "Raise batch_tokens, or lower the samples' size (fewer frames or pixels)")
    return sizes
