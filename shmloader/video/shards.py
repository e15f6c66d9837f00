"""WebDataset tar shards and their patterns: which shards a pattern names, which samples a
shard's members make (``VideoClips.from_shards``, ``shmloader scan``)."""

from __future__ import annotations

import os
from typing import Iterable

from .media import has_scheme, is_remote, local_path, scheme_of
from .storage import Storage

__all__ = ["expand", "shard_samples"]


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
                scheme = scheme_of(p)[0]
                found = storage.call(p, "listing", lambda fs: fs.glob(p))
                out.extend(sorted(f if has_scheme(f) else scheme + f for f in found))
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
