"""Remote bytes in blocks: the bounded LRU block cache one process reads through, and
:class:`RangeFile`, a seekable file over a byte range that FFmpeg and ``tarfile`` read (NOTE
[ Reading remote files ] in ``video.storage``)."""

from __future__ import annotations

import io
import re
import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable, Iterable

__all__ = ["BlockCache", "RangeFile", "merge"]


class BlockCache:
    """Blocks of ``block_size`` bytes of remote files, at most ``cache_bytes`` of them, least
    recent out first; a missing run of blocks is fetched in one request (``fetch(url, start,
    end)``, ``size(url)`` bounding the last block). Thread-safe: fetches run in threads."""

    def __init__(self, fetch: Callable[[str, int, int], bytes], size: Callable[[str], int], block_size: int,
                 cache_bytes: int) -> None:
        self.fetch, self.size = fetch, size
        self.block_size, self.cache_bytes = block_size, cache_bytes
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        # Files a server sent whole for a part (it ignores Range), kept whole within cache_bytes
        # (NOTE [ Reading remote files ]), and the hosts already said to do so.
        self._whole: OrderedDict[str, bytes] = OrderedDict()
        self._no_ranges: set[str] = set()

    def whole(self, url: str) -> bytes | None:
        """The file ``url`` if a server sent it whole and it is kept."""
        with self._lock:
            return self._whole.get(url)

    def sent_whole(self, url: str, data: bytes, name: str) -> bytes:
        """Keep ``data``, the whole file ``url`` a server sent for a part of it, within
        ``cache_bytes``; the first time for its host, say so (``name``: the URL as errors show it)."""
        host = re.match(r"[^:/]*://[^/]*|", url)[0] or url  # type: ignore[index]  # the pattern always matches
        with self._lock:
            if len(data) <= self.cache_bytes:
                self._whole[url] = data
                kept = sum(map(len, self._whole.values()))
                while kept > self.cache_bytes:
                    kept -= len(self._whole.popitem(last=False)[1])
            first = host not in self._no_ranges
            self._no_ranges.add(host)
        if first:
            too_big = "" if len(data) <= self.cache_bytes else " (not this one: it is larger than fetch's cache_bytes)"
            warnings.warn(f"{name}: the server ignores HTTP Range requests and sent the whole file "
                          f"({len(data) / 1e6:.1f} MB) for a part of it; each process now reads such a file once "
                          f"and keeps it{too_big}. A server or object store that answers Range requests is read "
                          "only where the frames are", RuntimeWarning, stacklevel=3)
        return data

    def read(self, url: str, start: int, end: int, whole: bool = True) -> bytes:
        """Bytes ``[start, end)`` of ``url`` through the block cache (missing blocks fetched in one
        request per run of them). ``whole=False``: from ``start`` up to the first block after it
        that is not cached (the run of missing blocks at ``start`` fetched first, if any), which
        may be fewer bytes than asked for: what FFmpeg reads through, as it asks for a buffer's
        worth past the packet it needs, and asks again where it needs more."""
        b = self.block_size
        first, last = start // b, (end - 1) // b
        runs = self._missing(url, first, last)
        if not whole and runs:
            if runs[0][0] == first:
                self.fill(url, runs.pop(0))
            if runs:
                last = runs[0][0] - 1
                end, runs = (last + 1) * b, []
        for run in runs:
            self.fill(url, run)
        with self._lock:
            parts = [self._blocks.get((url, k)) for k in range(first, last + 1)]
            for k in range(first, last + 1):
                if (url, k) in self._blocks:
                    self._blocks.move_to_end((url, k))
        # a block evicted by a read beside this one is fetched again
        data = b"".join(p if p is not None else self.fill(url, [k])[0] for k, p in zip(range(first, last + 1), parts))
        lo = start - first * b
        return data[lo : lo + end - start]

    def _missing(self, url: str, first: int, last: int) -> list[list[int]]:
        """Runs of consecutive blocks in ``first..last`` not in the cache."""
        runs: list[list[int]] = []
        with self._lock:
            for k in range(first, last + 1):
                if (url, k) in self._blocks:
                    continue
                if runs and runs[-1][-1] == k - 1:
                    runs[-1].append(k)
                else:
                    runs.append([k])
        return runs

    def fill(self, url: str, blocks: list[int]) -> list[bytes]:
        b = self.block_size
        lo, hi = blocks[0] * b, (blocks[-1] + 1) * b
        hi = min(hi, self.size(url))
        data = self.fetch(url, lo, hi)
        out = [data[i * b : (i + 1) * b] for i in range(len(blocks))]
        with self._lock:
            for k, part in zip(blocks, out):
                self._keep((url, k), part)
        return out

    def _keep(self, key: tuple[str, int], part: bytes) -> None:
        old = self._blocks.pop(key, None)
        if old is not None:
            self._cached -= len(old)
        self._blocks[key] = part
        self._cached += len(part)
        while self._cached > self.cache_bytes and len(self._blocks) > 1:
            self._cached -= len(self._blocks.popitem(last=False)[1])

    def runs(self, url: str, ranges: Iterable[tuple[int, int]], base: int = 0) -> list[tuple[str, list[int]]]:
        """The runs of blocks not cached yet that hold byte ``ranges`` (+ ``base``) of ``url``."""
        b = self.block_size
        jobs: list[tuple[str, list[int]]] = []
        for lo, hi in merge(ranges, b):
            if hi > lo:
                jobs.extend((url, run) for run in self._missing(url, (base + lo) // b, (base + hi - 1) // b))
        return jobs


def merge(ranges: Iterable[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """``ranges`` sorted, those closer than ``gap`` joined: one request is cheaper than two."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


class RangeFile(io.RawIOBase):
    """Bytes ``[offset, offset + size)`` of ``url`` as a read-only seekable file, read through
    ``storage``'s block cache: what FFmpeg (PyAV) and ``tarfile`` read remote files through.
    ``short``: a read returns the bytes up to the first block not cached after the first (as a
    raw file may), for FFmpeg, whose buffer refills ask for far more than the packet it wants;
    ``tarfile`` wants every byte it asks for."""

    def __init__(self, storage: Any, url: str, offset: int, size: int, name: str | None = None,
                 short: bool = False) -> None:
        super().__init__()
        self.storage, self.url, self.offset, self.size = storage, url, int(offset), int(size)
        self.name = name or url
        self.pos = 0
        self.short = short  # a read may end where the cached bytes do (BlockCache.read's whole=False)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self.pos = pos
        elif whence == io.SEEK_CUR:
            self.pos += pos
        elif whence == io.SEEK_END:
            self.pos = self.size + pos
        else:
            raise ValueError(f"whence {whence}")
        if self.pos < 0:
            raise ValueError("negative seek position")
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        data = self.storage.read(self.url, self.offset + self.pos, self.offset + end, whole=not self.short)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)
