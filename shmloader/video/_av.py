"""PyAV across its versions: what changed between av 17.1 and av 19, decided once.

- ``av.open(..., metadata_errors=)`` is gone in av 19, which reads every tag as UTF-8 with
  ``surrogateescape`` and never raises on one. Below 19, ``metadata_errors="ignore"`` keeps a
  tag in another encoding from failing the open.
- av 17.1 and decord2 3.4 ship FFmpeg libraries under the same file names, so one copy serves
  both, and PyAV's log callback then takes decord's FFmpeg lines (the damage they report) away
  from descriptor 2, where ``engine.native_log`` reads them: :func:`ffmpeg_logs_to_stderr`.
- Rational attributes (``time_base``, ``average_rate``, ...) are ``av.AVRational`` from av 19,
  never ``None`` (unset is a falsy 0/1); ``fractions.Fraction`` before. :func:`fraction` takes
  either (and ``None``).

And one thing that does not change: FFmpeg's "[Errno 1094995529] Invalid data found when
processing input" for a file it cannot open. :func:`open_input` says why in words
(:class:`UnreadableVideoError`): an empty file, an MP4/MOV cut short before its index (the
``moov`` box, written last unless the file was made for streaming: a download or a copy that
stopped), or no format FFmpeg knows (not a video, or cut short).
"""

from __future__ import annotations

import os
import struct
from fractions import Fraction
from typing import Any

import av

__all__ = ["open_input", "filter_graph", "fraction", "ffmpeg_logs_to_stderr", "AV_MAJOR", "UnreadableVideoError"]

AV_MAJOR = int(av.__version__.split(".")[0])
_OPEN_OPTIONS: dict[str, Any] = {} if AV_MAJOR >= 19 else {"metadata_errors": "ignore"}


# MP4/MOV top-level boxes looked at to tell a cut file from another kind of file.
_MP4_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"uuid", b"moof", b"styp", b"sidx"}
_MAX_BOXES = 256


class UnreadableVideoError(av.error.InvalidDataError):
    """FFmpeg's InvalidDataError for a file it cannot open, with the cause in words (no error number)."""

    def __str__(self) -> str:
        return f"{self.strerror}: {self.filename!r}"


def open_input(source: Any) -> Any:
    """``av.open(source)`` for reading, with the options of this av version (an InputContainer).

    A file FFmpeg cannot open raises :class:`UnreadableVideoError` (an ``av.error.InvalidDataError``)
    that says why in words."""
    try:
        return av.open(source, **_OPEN_OPTIONS)
    except av.error.InvalidDataError as e:
        why = _why_unreadable(source)
        raise UnreadableVideoError(e.errno or 0, f"{why} (FFmpeg: {e.strerror})", e.filename) from e


def _why_unreadable(source: Any) -> str:
    """Why FFmpeg found nothing it can read in ``source`` (a path or a seekable binary file)."""
    try:
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                return _why_unreadable_file(f)
        if hasattr(source, "seek") and hasattr(source, "tell"):
            where = source.tell()
            try:
                source.seek(0)
                return _why_unreadable_file(source)
            finally:
                source.seek(where)
    except (OSError, ValueError):
        pass
    return "not a video FFmpeg can read, or cut short: no format recognised"


def _why_unreadable_file(f: Any) -> str:
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return "empty file (0 bytes)"
    at, past_end = 0, False
    kinds: list[bytes] = []
    while at < end and len(kinds) < _MAX_BOXES:
        f.seek(at)
        head = f.read(16)
        if len(head) < 8:
            past_end = True
            break
        size, kind = struct.unpack(">I4s", head[:8])
        if kind not in _MP4_BOXES:
            break
        if size == 1 and len(head) == 16:
            size = struct.unpack(">Q", head[8:])[0]
        elif size == 0:
            size = end - at
        kinds.append(kind)
        if size < 8:
            break
        at += size
        past_end = at > end
    if kinds and kinds[0] in (b"ftyp", b"moov", b"mdat", b"free", b"wide"):
        if b"moov" not in kinds and b"moof" not in kinds:
            cut = "cut short" if past_end else "cut short or never finished"
            return f"MP4/MOV file {cut}: no index (moov box) found, as after an incomplete download or copy"
        if past_end:
            return "MP4/MOV file cut short: its last box runs past the end of the file"
        return "MP4/MOV file FFmpeg cannot read"
    return "not a video FFmpeg can read, or cut short: no format recognised"


def fraction(value: Any) -> Fraction | None:
    """A stream rational as a Fraction; ``None`` for an unset one (None, or 0/1 from av 19)."""
    if not value:
        return None
    return Fraction(int(value.numerator), int(value.denominator))


def ffmpeg_logs_to_stderr() -> None:
    """FFmpeg's own log callback, which writes to descriptor 2, in place of PyAV's (which keeps
    the lines from it where PyAV installed one). Called where decord decodes: in a worker."""
    import av.logging

    av.logging.restore_default_callback()


def filter_graph() -> Any:
    """An empty libavfilter graph that runs on one thread: libavfilter otherwise makes each graph
    a pool of a thread per CPU (joined when the graph is freed), so each of W workers would start
    one per core of the machine, and slice-threaded scaling gave frames that differ from run to
    run under load. A PyAV without ``Graph.threads`` keeps the pool."""
    g = av.filter.Graph()
    if hasattr(g, "threads"):
        g.threads = 1
    return g
