"""Where video files live: local paths, fsspec URLs, and members of tar shards, read by byte range.

NOTE [ Reading remote files ]
A path is local unless it is an fsspec URL (``s3://``, ``gs://``, ``https://``, ``hf://``...) or
names a member of a tar shard (``tar://key.mp4::<the shard's path or URL>``). A remote file is
never copied to disk: decoders read it through :class:`RangeFile`, a seekable file object whose
reads become byte-range requests. FFmpeg reads only what it needs: the container's header and
index once per worker (the probe), then after each seek the packets from the keyframe before a
clip to its last frame, and with audio the audio packets of the clip's span and pre-roll.
Before a clip is decoded, :meth:`Storage.prefetch` fetches exactly those packets' bytes (known
from the probe's index; an MP4's index places the audio's too: ``video.audiobytes``) in one
request per stretch, so a clip of a two-hour file costs its own few MB and one round trip, not
the file and not one round trip per block. FFmpeg asks for a buffer's worth (up to a few hundred
KB) past the packet it reads: its reads end where the cached bytes do (``RangeFile``'s short
reads), so the read-ahead fetches nothing. Whatever FFmpeg reads besides (a header, a packet
the index placed differently) is fetched on demand in blocks of ``block_size``.

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

A server that ignores HTTP Range (Python's ``http.server``, some proxies) sends the whole file for
every request. The first such answer is said once per process and host, in a warning that names
the URL; the file is then kept whole (within ``cache_bytes``), so each process reads it once, not
once a request, and ``bytes_read`` counts what the server sent, not what was asked for.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tarfile
import threading
import time
from collections import OrderedDict
from typing import Any, Iterable, Mapping

from .._errors import install_hint
from .blocks import BlockCache, RangeFile
from .refusals import missing_credentials, missing_object
from .media import Media, is_remote, local_path, scheme_of, split_member

__all__ = ["Storage", "LOCAL", "redact", "first_line", "tar_members"]

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
        self._cache = BlockCache(self.fetch, self.size, self.block_size, self.cache_bytes)
        # Both bounded (least recent out first): a worker meets millions of files in a large dataset.
        self._stats: OrderedDict[str, tuple[float, tuple[int, int], int]] = OrderedDict()  # url -> (when, stamp, size)
        self._places: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()  # (shard, member) -> (offset, size)
        self._lock = threading.Lock()  # the cache and counts: fetches run in threads (prefetch_many)
        self._threads = None

    def __getstate__(self) -> dict[str, Any]:
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
        return scheme_of(url)[1].lower() if is_remote(url) else "file"

    @staticmethod
    def filesystem_class(protocol: str):
        """fsspec's class for ``protocol``; ImportError naming the extra to install if its package is missing."""
        import fsspec

        try:
            return fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as e:
            extra = _EXTRAS.get(protocol)
            hint = install_hint(extra) if extra else "install the fsspec package for it"
            raise ImportError(f"reading {protocol}:// URLs needs a package that is not installed ({hint}): "
                              f"{first_line(e)}") from None

    def filesystem(self, url: str):
        """The fsspec filesystem for ``url``'s protocol (one per protocol and process)."""
        protocol = scheme_of(url)[1].lower()
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

    def resolve(self, path: str) -> Media:
        """``path``'s place and version, asked once: what the probe, the decoders and the seek
        evidence are handed (``video.media``). A local file that is missing or not a file is a
        FileNotFoundError here."""
        if not is_remote(path):
            local = local_path(path)
            try:
                st = os.stat(local)
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(f"not a file: {path!r}")
            return Media(path, st.st_size, (st.st_size, st.st_mtime_ns))
        _, stamp, size = self._remote_stat(path)
        m = split_member(path)
        if m is None:
            return Media(path, size, stamp, url=path)
        return Media(path, size, stamp, url=m[1], offset=self.member(*m)[0])

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
        return self._remote_stat(path)

    def _remote_stat(self, path: str) -> tuple[float, tuple[int, int], int]:
        """(when, stamp, size) of a remote file or member, asked once per ``stat_ttl``."""
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
            info = self.call(path, "stat", lambda fs: fs.info(path))
            size = info.get("size")
            if size is None:
                raise OSError(f"{self.name(path)}: the server does not say the file's size")
            etag = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or \
                info.get("last_modified") or ""
            got = (now, (int(size), _hash(str(etag))), int(size))
        self._stats[path] = got
        _bound(self._stats, _KEPT)
        return got

    def seen(self, media: Media) -> None:
        """``media`` as another worker of the loader resolved it just now, taken as this
        storage's own look at it (asked again after ``stat_ttl``): no HEAD request of ours."""
        if media.remote and media.path not in self._stats:
            self._stats[media.path] = (time.monotonic(), media.stamp, media.size)
            _bound(self._stats, _KEPT)

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

    def media(self, media: Media | str):
        """What FFmpeg opens: a local file's path as it is (FFmpeg's own file reading), else a
        RangeFile."""
        media = media if isinstance(media, Media) else self.resolve(media)
        return media.local if not media.remote else self.open(media, short=True)

    def open_bytes(self, media: Media | str):
        """A binary file object: the local file itself, else a RangeFile."""
        media = media if isinstance(media, Media) else self.resolve(media)
        return open(media.local, "rb") if not media.remote else self.open(media)

    def open(self, media: Media | str, short: bool = False) -> RangeFile:
        """A remote file as a seekable file; its first and last blocks fetched at once, together:
        a container's header is at the start, and an MP4's index often at the end. ``short``:
        its reads end where the cached bytes do (what FFmpeg reads: ``RangeFile``)."""
        media = media if isinstance(media, Media) else self.resolve(media)
        f = RangeFile(self, media.url, media.offset, media.size, name=media.path, short=short)
        if is_remote(f.url):
            edge = min(f.size, self.block_size)
            self.prefetch_many([(media, [(0, edge), (f.size - edge, f.size)])])
        return f

    def fetch(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (not of a member: see RangeFile), retried."""
        if end <= start:
            return b""
        kept = self._cache.whole(url)
        if kept is not None:
            return kept[start:end]
        if not is_remote(url):
            with open(local_path(url), "rb") as f:
                data = os.pread(f.fileno(), end - start, start)
        else:
            data = self.call(url, f"reading bytes {start}-{end - 1}",
                              lambda fs: fs.cat_file(url, start=start, end=end,
                                                     **({"timeout": self.timeout} if fs.async_impl else {})))
        with self._lock:
            self.bytes_read += len(data)
            self.requests += 1
        if len(data) > end - start:  # the server ignores Range: it sent the whole file
            data = self._cache.sent_whole(url, data, self.name(url))[start:end]
        if len(data) != end - start and end <= self.size(url):
            raise OSError(f"{self.name(url)}: asked for bytes {start}-{end - 1}, got {len(data)} bytes")
        return data

    def call(self, url: str, what: str, op):
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
                if cause is None or code in (404, 410) or missing_object(cause) or \
                        isinstance(cause, (FileNotFoundError, PermissionError)):
                    why = self.redact(first_line(e))
                    if not why or why in (url, self.name(url)) or url in why:
                        why = "no such file or object" if isinstance(e, FileNotFoundError) else type(e).__name__
                    raise type(e)(f"{self.name(url)}: {why}") from None
                last_error = cause  # fsspec's HTTP says "not found" for any failed stat: the cause tells
            except _NOT_RETRIED as e:  # a mistake in the call or the options: no try will work
                raise type(e)(f"{self.name(url)}: {self.redact(first_line(e))}") from None
            except Exception as e:  # reset, 5xx, timeout, throttling: the next try may work
                if missing_object(e):
                    raise FileNotFoundError(f"{self.name(url)}: no such file or object") from None
                if (hint := missing_credentials(e, self.protocol(url))) is not None:
                    raise PermissionError(f"{self.name(url)}: {self.redact(hint)}") from None
                last_error = e
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise OSError(f"{self.name(url)}: {what} failed {self.retries + 1} times; last: "
                      f"{type(last_error).__name__}: {self.redact(first_line(last_error))}") from None

    def read(self, url: str, start: int, end: int, whole: bool = True) -> bytes:
        """Bytes ``[start, end)`` of ``url`` through the block cache (what a RangeFile reads);
        ``whole=False``: up to the first block not cached (``BlockCache.read``)."""
        return self._cache.read(url, start, end, whole)

    def prefetch(self, media: Media, ranges: Iterable[tuple[int, int]]) -> None:
        """Fetch byte ``ranges`` of a file (offsets in the file, or in the member) into the
        cache, one request per stretch of blocks not cached yet."""
        self.prefetch_many([(media, list(ranges))])

    def prefetch_many(self, wanted: Iterable[tuple[Media, list[tuple[int, int]]]]) -> None:
        """``prefetch`` for several files at once, the requests sent together (``_PARALLEL`` at
        a time): the clips of a task wait one round trip, not one each."""
        jobs: list[tuple[str, list[int]]] = []
        for media, ranges in wanted:
            if media.remote and is_remote(media.url):  # a member of a local shard is read from disk
                jobs.extend(self._cache.runs(media.url, ranges, media.offset))
        self.map(lambda job: self._cache.fill(*job), jobs)

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


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first non-blank line of ``e``'s message, at most ``limit`` characters (its type's name
    if it has none): what an error report repeats of a cause."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:limit] if lines else type(e).__name__


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
