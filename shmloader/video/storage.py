"""Where video files live: local paths, fsspec URLs, and members of tar shards, read by byte range.

NOTE [ Reading remote files ]
A path is local unless it is an fsspec URL (``s3://``, ``gs://``, ``https://``, ``hf://``...) or
names a member of a tar shard (``tar://key.mp4::<the shard's path or URL>``). A remote file is
never copied to disk: decoders read it through :class:`RangeFile`, a seekable file object whose
reads become byte-range requests. FFmpeg reads only what it needs: the container's header and
index once per worker (the probe), then after each seek the packets from the keyframe before a
clip to its last frame. Before a clip is decoded, :meth:`Storage.prefetch` fetches exactly those
packets' bytes (known from the probe's index) in one request per stretch, so a clip of a
two-hour file costs its own few MB and one round trip, not the file and not one round trip per
block. Whatever FFmpeg reads besides (a header, a packet the index placed differently) is
fetched on demand in blocks of ``block_size``.

Fetched blocks stay in one bounded LRU cache per worker (``cache_bytes``): FFmpeg rereads a
header or a GOP, a neighbouring clip shares a GOP. A request that fails (reset, 5xx, timeout,
throttling) is retried ``retries`` times with exponential backoff; then the read raises
OSError naming the URL — without the user name and password a URL may carry, and without any
of ``storage_options``' values (credentials never reach an error, a log or the loader).
A missing object is not retried.

Tar shards (``tarfile``'s own reading of the headers, through the same range reads): a shard's
member table (name -> offset, size) is read once per process and cached; a member is then a
:class:`RangeFile` over its bytes inside the shard. A manifest or ``from_shards`` hands the
offsets to the workers, which then never read the headers.

Objects are taken as unchanged while their (size, ETag or modification time) is; a worker
checks it once per ``stat_ttl`` seconds, not once per clip (a HEAD request each).
"""

from __future__ import annotations

import functools
import io
import os
import re
import tarfile
import threading
import time
from collections import OrderedDict
from typing import Any, Iterable, Mapping

__all__ = ["Storage", "RangeFile", "LOCAL", "is_remote", "local_path", "split_member", "member_url", "redact",
           "expand", "first_line", "shard_samples", "tar_members"]

# ``scheme://`` of an fsspec URL, and the chain separator of a member URL.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/@]*@")

# The optional package that reads each protocol: named in the error when it is missing.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure",
           "adl": "azure", "http": "http", "https": "http", "hf": "hf"}

_BLOCK = 1 << 17  # 128 KiB: what FFmpeg reads past a prefetched range costs one small request
_CACHE = 64 << 20
_RETRIES = 5
_BACKOFF = 0.1  # seconds before the first retry, doubling
_TIMEOUT = 30.0  # seconds one request may take
_STAT_TTL = 60.0
_PARALLEL = 8  # requests a worker has in flight at once (prefetch_many)
_KEPT = 200_000  # sizes and stamps, and members' places, a worker keeps
# Errors of the call itself (bad options, a missing package): raised at once, never retried.
_NOT_RETRIED = (ValueError, TypeError, ImportError, NotImplementedError, AttributeError, KeyError)


def is_remote(path: str) -> bool:
    """Whether ``path`` is read through fsspec: a URL whose ``scheme://`` is a protocol fsspec
    knows (``file://`` aside), or a member of a tar shard (``tar://member::shard``). Other
    schemes (``rtmp://``, ``udp://``...) are FFmpeg's, behind ``allow_urls``."""
    m = _SCHEME.match(path)
    if not m or m[1].lower() in ("file", "local"):
        return False
    return m[1].lower() in _fsspec_protocols()


def _scheme(url: str) -> re.Match[str]:
    """The ``scheme://`` of a URL (``is_remote`` said it has one)."""
    m = _SCHEME.match(url)
    if m is None:
        raise ValueError(f"not a URL: {url!r}")
    return m


@functools.lru_cache(maxsize=1)
def _fsspec_protocols() -> frozenset[str]:
    from fsspec.registry import known_implementations, registry

    return frozenset(known_implementations) | frozenset(registry)


def local_path(path: str) -> str:
    """``file:///a/b`` -> ``/a/b``; other paths unchanged."""
    m = _SCHEME.match(path)
    return path[len(m[0]):] if m and m[1].lower() in ("file", "local") else path


def split_member(path: str) -> tuple[str, str] | None:
    """(member, shard) of ``tar://member::shard``, else None."""
    if not path.startswith("tar://") or "::" not in path:
        return None
    member, shard = path[len("tar://"):].split("::", 1)
    return member, shard


def member_url(member: str, shard: str) -> str:
    return f"tar://{member}::{shard}"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without user:password@ in URLs and without any of ``secrets``."""
    text = re.sub(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]*@", r"\1", text)
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    return text


def _secrets(options: Mapping[str, Any]) -> list[str]:
    """Every string among ``options``' values, nested ones included."""
    out: list[str] = []
    for v in options.values():
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, Mapping):
            out.extend(_secrets(v))
    return out


class Storage:
    """How one process reads files: local ones by path, remote ones by byte range through fsspec
    with ``storage_options`` (passed to the filesystem of each protocol), a bounded block cache,
    retries, and counts of what was read (``bytes_read``, ``requests``)."""

    def __init__(self, storage_options: Mapping[str, Any] | None = None, *, block_size: int = _BLOCK,
                 cache_bytes: int = _CACHE, retries: int = _RETRIES, timeout: float = _TIMEOUT,
                 stat_ttl: float = _STAT_TTL) -> None:
        self.options = dict(storage_options or {})
        self.block_size = int(block_size)
        self.cache_bytes = int(cache_bytes)
        self.retries = int(retries)
        self.timeout = float(timeout)
        self.stat_ttl = float(stat_ttl)
        self.bytes_read = 0
        self.requests = 0
        self._secrets = _secrets(self.options)
        self._fs: dict[str, Any] = {}
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._cached = 0
        # Both bounded (least recent out first): a worker meets millions of files in a large dataset.
        self._stats: OrderedDict[str, tuple[float, tuple[int, int], int]] = OrderedDict()  # url -> (when, stamp, size)
        self._places: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()  # (shard, member) -> (offset, size)
        self._lock = threading.Lock()  # the cache and counts: fetches run in threads (prefetch_many)
        self._threads = None

    def __getstate__(self):
        return {"storage_options": self.options, "block_size": self.block_size, "cache_bytes": self.cache_bytes,
                "retries": self.retries, "timeout": self.timeout, "stat_ttl": self.stat_ttl}

    def __setstate__(self, state):
        opts = state.pop("storage_options")
        self.__init__(opts, **state)

    # -- what a file is ------------------------------------------------------------------------

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def name(self, path: str) -> str:
        """``path`` as errors show it."""
        return self.redact(path)

    @staticmethod
    def protocol(url: str) -> str:
        """The protocol that reads ``url``: a member's is its shard's; "file" for a local path."""
        m = split_member(url)
        if m is not None:
            return Storage.protocol(m[1])
        return _scheme(url)[1].lower() if is_remote(url) else "file"

    @staticmethod
    def filesystem_class(protocol: str):
        """fsspec's class for ``protocol``; ImportError naming the extra to install if its package is missing."""
        import fsspec

        try:
            return fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as e:
            extra = _EXTRAS.get(protocol)
            hint = f'pip install "shmloader[{extra}]"' if extra else "install the fsspec package for it"
            raise ImportError(f"reading {protocol}:// URLs needs a package that is not installed ({hint}): "
                              f"{first_line(e)}") from None

    def filesystem(self, url: str):
        """The fsspec filesystem for ``url``'s protocol (one per protocol and process)."""
        protocol = _scheme(url)[1].lower()
        fs = self._fs.get(protocol)
        if fs is None:
            cls = self.filesystem_class(protocol)
            kwargs = dict(self.options.get(protocol, self.options) if _nested(self.options) else self.options)
            if protocol in ("http", "https") and "client_kwargs" not in kwargs:
                import aiohttp

                kwargs["client_kwargs"] = {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                                                            sock_read=self.timeout)}
            fs = self._fs[protocol] = cls(**kwargs)
        return fs

    def size(self, path: str) -> int:
        return self._stat(path)[2]

    def stamp(self, path: str) -> tuple[int, int]:
        """What changes when the file does: (size, mtime_ns) locally; remotely (size, a 63-bit
        hash of the ETag or modification time), what a scan manifest keeps as ``mtime_ns``."""
        return self._stat(path)[1]

    def _stat(self, path: str) -> tuple[float, tuple[int, int], int]:
        if not is_remote(path):
            st = os.stat(local_path(path))
            return 0.0, (st.st_size, st.st_mtime_ns), st.st_size
        now = time.monotonic()
        hit = self._stats.get(path)
        if hit is not None and now - hit[0] < self.stat_ttl:
            return hit
        m = split_member(path)
        if m is not None:
            member, shard = m
            offset, size = self.member(member, shard)
            _, (_, tag), _ = self._stat(shard)
            got = (now, (size, _hash(f"{tag}@{offset}")), size)
        else:
            info = self._call(path, "stat", lambda fs: fs.info(path))
            size = info.get("size")
            if size is None:
                raise OSError(f"{self.name(path)}: the server does not say the file's size")
            etag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or \
                info.get("last_modified") or ""
            got = (now, (int(size), _hash(str(etag))), int(size))
        self._stats[path] = got
        _bound(self._stats, _KEPT)
        return got

    # -- members of tar shards -----------------------------------------------------------------

    def add_members(self, shard: str, members: Mapping[str, tuple[int, int]]) -> None:
        """Tell where members of ``shard`` lie (from a manifest): their headers are not read."""
        with self._lock:
            for name, place in members.items():
                self._places[(shard, name)] = place
                self._places.move_to_end((shard, name))
            _bound(self._places, _KEPT)

    def member(self, member: str, shard: str) -> tuple[int, int]:
        """(offset, size) of ``member``'s data in ``shard``."""
        hit = self._places.get((shard, member))
        if hit is not None:
            return hit
        table = tar_members(self, shard)  # not told: read the shard's headers
        self.add_members(shard, table)
        try:
            return table[member]
        except KeyError:
            raise FileNotFoundError(f"no member {member!r} in the tar shard {self.name(shard)}") from None

    # -- reading -------------------------------------------------------------------------------

    def read_text(self, path: str) -> str:
        """A small file or member (a label, a caption) as text."""
        with self.open_bytes(path) as f:
            return f.read().decode("utf-8", "replace").strip()

    def media(self, path: str):
        """What FFmpeg opens: a local path as it is (FFmpeg's own file reading), else a RangeFile."""
        return local_path(path) if not is_remote(path) else self.open(path)

    def open_bytes(self, path: str):
        """A binary file object of ``path``: the local file itself, else a RangeFile."""
        return open(local_path(path), "rb") if not is_remote(path) else self.open(path)

    def open(self, path: str) -> "RangeFile":
        """``path`` as a seekable file; its first and last blocks fetched at once, together: a
        container's header is at the start, and an MP4's index often at the end."""
        m = split_member(path)
        if m is not None:
            member, shard = m
            offset, size = self.member(member, shard)
            f = RangeFile(self, shard, offset, size, name=path)
        else:
            f = RangeFile(self, path, 0, self.size(path))
        if is_remote(f.url):
            edge = min(f.size, self.block_size)
            self.prefetch_many([(path, [(0, edge), (f.size - edge, f.size)])])
        return f

    def fetch(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (not of a member: see RangeFile), retried."""
        if end <= start:
            return b""
        if not is_remote(url):
            with open(local_path(url), "rb") as f:
                data = os.pread(f.fileno(), end - start, start)
        else:
            data = self._call(url, f"reading bytes {start}-{end - 1}",
                              lambda fs: fs.cat_file(url, start=start, end=end,
                                                     **({"timeout": self.timeout} if fs.async_impl else {})))
            if len(data) > end - start:
                data = data[start:end]  # a server that ignores Range sends the whole file
        with self._lock:
            self.bytes_read += len(data)
            self.requests += 1
        if len(data) != end - start and end <= self.size(url):
            raise OSError(f"{self.name(url)}: asked for bytes {start}-{end - 1}, got {len(data)} bytes")
        return data

    def _call(self, url: str, what: str, op):
        """``op(filesystem)``, retried with backoff on anything but a missing file."""
        fs = self.filesystem(url)
        delay = _BACKOFF
        last_error: BaseException = OSError("no attempt")
        for attempt in range(self.retries + 1):
            try:
                return op(fs)
            except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
                cause = e.__cause__
                code = getattr(cause, "status", None) or getattr(cause, "status_code", None)
                if code in (401, 403):
                    raise PermissionError(f"{self.name(url)}: access denied (HTTP {code})") from None
                if cause is None or code in (404, 410) or isinstance(cause, (FileNotFoundError, PermissionError)):
                    why = self.redact(first_line(e))
                    if not why or why in (url, self.name(url)) or url in why:
                        why = "no such file or object" if isinstance(e, FileNotFoundError) else type(e).__name__
                    raise type(e)(f"{self.name(url)}: {why}") from None
                last_error = cause  # fsspec's HTTP says "not found" for any failed stat: the cause tells
            except _NOT_RETRIED as e:  # a mistake in the call or the options: no try will work
                raise type(e)(f"{self.name(url)}: {self.redact(first_line(e))}") from None
            except Exception as e:  # reset, 5xx, timeout, throttling: the next try may work
                last_error = e
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise OSError(f"{self.name(url)}: {what} failed {self.retries + 1} times; last: "
                      f"{type(last_error).__name__}: {self.redact(first_line(last_error))}") from None

    def read(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url`` through the block cache (missing blocks fetched in one
        request per run of them)."""
        b = self.block_size
        first, last = start // b, (end - 1) // b
        for run in self._missing(url, first, last):
            self._fill(url, run)
        with self._lock:
            parts = [self._blocks.get((url, k)) for k in range(first, last + 1)]
            for k in range(first, last + 1):
                if (url, k) in self._blocks:
                    self._blocks.move_to_end((url, k))
        # a block evicted by a read beside this one is fetched again
        data = b"".join(p if p is not None else self._fill(url, [k])[0] for k, p in zip(range(first, last + 1), parts))
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

    def _fill(self, url: str, blocks: list[int]) -> list[bytes]:
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

    def prefetch(self, path: str, ranges: Iterable[tuple[int, int]]) -> None:
        """Fetch byte ``ranges`` of ``path`` (offsets in the file, or in the member) into the
        cache, one request per stretch of blocks not cached yet."""
        self.prefetch_many([(path, list(ranges))])

    def prefetch_many(self, wanted: Iterable[tuple[str, list[tuple[int, int]]]]) -> None:
        """``prefetch`` for several files at once, the requests sent together (``_PARALLEL`` at
        a time): the clips of a task wait one round trip, not one each."""
        jobs: list[tuple[str, list[int]]] = []
        for path, ranges in wanted:
            if not is_remote(path):
                continue
            m = split_member(path)
            url, base = path, 0
            if m is not None:
                url, base = m[1], self.member(*m)[0]
                if not is_remote(url):
                    continue
            b = self.block_size
            for lo, hi in _merge(ranges, b):
                if hi > lo:
                    jobs.extend((url, run) for run in self._missing(url, (base + lo) // b, (base + hi - 1) // b))
        self.map(lambda job: self._fill(*job), jobs)

    def map(self, fn, items: list) -> list:
        """``[fn(x) for x in items]``, ``_PARALLEL`` at a time in threads (network waits overlap).
        Called from one of those threads (a probe that fetches), it runs there, one by one: a
        pool thread waiting on the pool it belongs to could wait for ever."""
        if len(items) <= 1 or getattr(_in_pool, "yes", False):
            return [fn(x) for x in items]

        def inside(x):
            _in_pool.yes = True
            return fn(x)

        return list(self._pool().map(inside, items))

    def _pool(self):
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = ThreadPoolExecutor(_PARALLEL, thread_name_prefix="shmloader-fetch")
        return self._threads

    def counters(self) -> dict[str, int]:
        return {"bytes_read": self.bytes_read, "requests": self.requests}


LOCAL = Storage()  # what reads paths where no storage_options were given
_in_pool = threading.local()


def _bound(table: OrderedDict, most: int) -> None:
    while len(table) > most:
        table.popitem(last=False)


def _hash(text: str) -> int:
    """A stable 63-bit number for ``text`` (the same in every process, unlike ``hash``)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def _nested(options: Mapping[str, Any]) -> bool:
    """Options given per protocol: ``{"s3": {...}, "https": {...}}``."""
    return bool(options) and all(isinstance(v, Mapping) for v in options.values()) and \
        all(k in _EXTRAS or k in ("file", "tar", "memory") for k in options)


def _merge(ranges: Iterable[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """``ranges`` sorted, those closer than ``gap`` joined: one request is cheaper than two."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first non-blank line of ``e``'s message, at most ``limit`` characters (its type's name
    if it has none): what an error report repeats of a cause."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:limit] if lines else type(e).__name__


class RangeFile(io.RawIOBase):
    """Bytes ``[offset, offset + size)`` of ``url`` as a read-only seekable file, read through
    ``storage``'s block cache: what FFmpeg (PyAV) and ``tarfile`` read remote files through."""

    def __init__(self, storage: Storage, url: str, offset: int, size: int, name: str | None = None) -> None:
        super().__init__()
        self.storage, self.url, self.offset, self.size = storage, url, int(offset), int(size)
        self.name = name or url
        self.pos = 0

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
        data = self.storage.read(self.url, self.offset + self.pos, self.offset + end)
        self.pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def expand(urls: str | Iterable[str], storage: Storage) -> list[str]:
    """Shard paths from a list, a brace pattern (``s3://b/shard-{000..099}.tar``, expanded as
    bash does) or a glob (``s3://b/shards/*.tar``, listed by the filesystem, sorted)."""
    import braceexpand

    items = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
    out: list[str] = []
    for item in items:
        for p in braceexpand.braceexpand(os.fspath(item)):
            if not any(ch in p for ch in "*?["):
                out.append(p if is_remote(p) else os.path.abspath(local_path(p)))
            elif is_remote(p):
                scheme = _scheme(p)[0]
                found = storage._call(p, "listing", lambda fs: fs.glob(p))
                out.extend(sorted(f if _SCHEME.match(f) else scheme + f for f in found))
            else:
                import glob

                out.extend(sorted(glob.glob(os.path.abspath(local_path(p)))))
    return out


def shard_samples(members: Iterable[str]) -> dict[str, dict[str, str]]:
    """WebDataset's samples among a shard's member names, in shard order: key -> {extension: name},
    the key being a name up to the first dot of its base name (``a/x.seg1.mp4``: ``a/x``,
    ``seg1.mp4``); names without a dot belong to no sample."""
    samples: dict[str, dict[str, str]] = {}
    for name in members:
        folder, base = os.path.split(name)
        if "." in base:
            stem, ext = base.split(".", 1)
            samples.setdefault(os.path.join(folder, stem), {})[ext.lower()] = name
    return samples


def tar_members(storage: Storage, shard: str) -> dict[str, tuple[int, int]]:
    """name -> (data offset, size) of every regular file in the tar ``shard``, reading its
    headers only (tarfile seeks past each member's data). Raises ValueError for a file that is
    not a tar or is cut off inside a header."""
    f: Any = storage.open(shard) if is_remote(shard) else open(local_path(shard), "rb")
    members: dict[str, tuple[int, int]] = {}
    end = 0
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            for m in tar:
                if m.isfile():
                    members[m.name] = (m.offset_data, m.size)
            end = tar.offset  # past the last member: the end-of-archive blocks start here
    except tarfile.ReadError as e:
        if not members:
            raise ValueError(f"{storage.name(shard)} is not a readable tar file: {e}") from None
        raise ValueError(f"the tar shard {storage.name(shard)} is cut off or damaged after "
                         f"{len(members)} members: {e}") from None
    finally:
        f.close()
    size = storage.size(shard)
    if size < end + 2 * tarfile.BLOCKSIZE:  # tarfile stops quietly where a cut-off header was
        raise ValueError(f"the tar shard {storage.name(shard)} is cut off after {len(members)} members "
                         f"(no end-of-archive blocks after byte {end}; it is {size} bytes)")
    for name, (offset, n) in members.items():
        if offset + n > size:
            raise ValueError(f"the tar shard {storage.name(shard)} is cut off inside {name!r} "
                             f"(it ends at byte {size}, the member at {offset + n})")
    return members
