"""What a path names, and one file's place resolved once.

A path is a local file, an fsspec URL (``s3://``, ``https://``...) or a member of a tar shard
(``tar://key.mp4::<shard>``): the string says which (``is_remote``, ``split_member``). Where
its bytes are and which version of them is read — size, a stamp that changes with the file, a
member's place in its shard — is asked of the storage once (``Storage.resolve``) and kept in a
:class:`Media` handle that the probe, the decoders and the seek evidence take: none of them asks
again whether the file is local. A handle is a few plain fields: it pickles into a task.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["Media", "is_remote", "local_path", "has_scheme", "scheme_of", "split_member", "member_url"]

# ``scheme://`` of an fsspec URL, and the chain separator of a member URL.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


@dataclass(frozen=True, slots=True)
class Media:
    """One file as resolved by ``Storage.resolve``: ``path`` as given (what errors and caches
    name), ``size`` in bytes, ``stamp`` (what changes when the file does: (size, mtime_ns)
    locally, (size, a hash of the ETag or modification time) remotely). A remote file's bytes
    are ``[offset, offset + size)`` of ``url``: the object itself (offset 0), or for a member of
    a tar shard, the shard; ``url`` is empty for a local file (FFmpeg reads it by its path)."""

    path: str
    size: int
    stamp: tuple[int, int]
    url: str = ""
    offset: int = 0

    @property
    def remote(self) -> bool:
        """Read through fsspec by byte range (a remote object or a shard member)."""
        return bool(self.url)

    @property
    def local(self) -> str:
        """The local file's path as FFmpeg opens it (``file://`` taken off)."""
        return local_path(self.path)


def is_remote(path: str) -> bool:
    """Whether ``path`` is read through fsspec: a URL whose ``scheme://`` is a protocol fsspec
    knows (``file://`` aside), or a member of a tar shard (``tar://member::shard``). Other
    schemes (``rtmp://``, ``udp://``...) are FFmpeg's, behind ``allow_urls``."""
    m = _SCHEME.match(path)
    if not m or m[1].lower() in ("file", "local"):
        return False
    return m[1].lower() in _fsspec_protocols()


def has_scheme(text: str) -> bool:
    """Whether ``text`` starts with a ``scheme://``."""
    return _SCHEME.match(text) is not None


def scheme_of(url: str) -> re.Match[str]:
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
