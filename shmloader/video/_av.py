"""PyAV across its versions: what changed between av 15 and av 19, decided once.

- ``av.open(..., metadata_errors=)`` is gone in av 19, which reads every tag as UTF-8 with
  ``surrogateescape`` and never raises on one. Below 19, ``metadata_errors="ignore"`` keeps a
  tag in another encoding from failing the open.
- av 17.1 and decord2 3.4 ship FFmpeg libraries under the same file names, so one copy serves
  both, and PyAV's log callback then takes decord's FFmpeg lines (the damage they report) away
  from descriptor 2, where ``engine.native_log`` reads them: :func:`ffmpeg_logs_to_stderr`.
- Rational attributes (``time_base``, ``average_rate``, ...) are ``av.AVRational`` from av 19,
  never ``None`` (unset is a falsy 0/1); ``fractions.Fraction`` before. :func:`fraction` takes
  either (and ``None``).

What av 15 and 16 lack (lerobot 0.6 pins ``av>=15,<16``), each found by looking at the installed
PyAV, not at its version number, and how the package does without:

- ``Stream.index_entries`` (:data:`INDEX_ENTRIES`; av 17.0), the container's own sample index.
  Without it a long MP4/MOV is timed by reading every packet (``mp4index``: ~3 us a frame, once per
  probe; a remote file's probe then fetches the whole file), a remote clip's audio bytes are not
  fetched ahead with its frames (the demuxer asks for them as it reads), and an MP4 cut short
  (a download that stopped) is found by its last top-level box running past the end of the file
  (:func:`boxes_end`) instead of by its index.
- ``Graph.threads`` (:data:`GRAPH_THREADS`), a filter graph's thread pool. Without it each filter
  is told ``threads=1`` (:func:`filter_graph`): scaling runs on one thread and gives the same pixels
  on every run, but each graph keeps libavfilter's pool of idle threads (one per CPU).
- ``VideoFrame.color_primaries`` and ``color_trc`` (:data:`FRAME_COLOUR`): a copy made by
  ``prepare`` is tagged with the source's; without them, :func:`colour_tags` reads the decoder's
  (the stream's tags, which its frames carry).
- ``VideoStream.set_display_rotation`` (av 17.1): nothing in the package writes a rotation; the
  tests tag their rotated file through the FFmpeg command line instead.
- The codec libraries of decord2's FFmpeg. decord loads its libraries into the process's global
  symbol scope, so once it is imported PyAV's FFmpeg calls decord2's copy of each library both
  wheels bundle. From av 17.1 the two bundle the same files; av 15 bundles libvpx.so.11 where
  decord2 3.4 has libvpx.so.12, and encoding VP8/VP9 beside decord then fails ("avcodec_open2(libvpx):
  Invalid argument"): :func:`decord_clashes` finds such libraries from the two wheels' file lists,
  and :func:`encodes_beside_decord` says whether an encoder still works. Decoding uses FFmpeg's own
  decoders (and libdav1d, bundled by both at one ABI): unchanged.

A feature that cannot be done without raises :class:`NeedsNewerAV` (``pip install 'av>=17.1'``),
through :func:`require`.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import sys
from fractions import Fraction
from importlib.metadata import PackageNotFoundError, distribution
from typing import Any

import av

__all__ = ["open_input", "filter_graph", "fraction", "ffmpeg_logs_to_stderr", "boxes_end", "require", "decord_clashes",
           "encodes_beside_decord", "colour_tags", "AV_MAJOR", "INDEX_ENTRIES", "GRAPH_THREADS", "FRAME_COLOUR",
           "NEWER_AV", "UnreadableVideoError", "NeedsNewerAV"]

AV_MAJOR = int(av.__version__.split(".")[0])
_OPEN_OPTIONS: dict[str, Any] = {} if AV_MAJOR >= 19 else {"metadata_errors": "ignore"}
# The features above, as the installed PyAV has them.
INDEX_ENTRIES: bool = hasattr(av.stream.Stream, "index_entries")
GRAPH_THREADS: bool = hasattr(av.filter.Graph, "threads")
FRAME_COLOUR: bool = hasattr(av.video.frame.VideoFrame, "color_primaries")
# The oldest PyAV that has every feature the package uses: what an error tells the user to install.
NEWER_AV = "av>=17.1"
# Encoders whose library, taken from decord2 at another ABI version, fails (seen: av 15's libvpx
# beside decord2 3.4's); libsvtav1 (SVT-AV1 3 beside 4) and libx265 (its symbols carry its ABI
# number) encoded right.
_CLASHING_ENCODERS = {"libvpx": "libvpx", "libvpx-vp9": "libvpx"}
# A library bundled in a wheel's "<dist>.libs" folder: name, the repair tool's hash, ABI version.
_BUNDLED = re.compile(r"(?P<name>.+?)-[0-9a-f]{8}\.so\.(?P<abi>\d+)(\..*)?")


# MP4/MOV top-level boxes looked at to tell a cut file from another kind of file.
_MP4_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"uuid", b"moof", b"styp", b"sidx"}
_MAX_BOXES = 256


class NeedsNewerAV(RuntimeError):
    """A feature the installed PyAV lacks: the message names the feature and the install that has it."""


def require(present: bool, feature: str) -> None:
    """Raise :class:`NeedsNewerAV` for ``feature`` (what the user asked for, in words) unless
    ``present`` (one of the flags above)."""
    if not present:
        raise NeedsNewerAV(f"{feature} needs a newer PyAV than the installed av {av.__version__}: "
                           f"pip install '{NEWER_AV}'")


@functools.cache
def decord_clashes() -> frozenset[str]:
    """The libraries both PyAV's and decord2's wheels bundle, each at another ABI version (the
    major number of its file name): with decord imported, PyAV's FFmpeg calls decord2's copy.
    Empty where either is not installed or bundles nothing (a build against system libraries)."""
    mine, theirs = _bundled("av"), _bundled("decord2")
    return frozenset(name for name in mine.keys() & theirs.keys() if mine[name] != theirs[name])


def _bundled(dist: str) -> dict[str, str]:
    try:
        files = distribution(dist).files or []
    except PackageNotFoundError:
        return {}
    out = {}
    for f in files:
        if len(f.parts) == 2 and f.parts[0].endswith(".libs") and (m := _BUNDLED.fullmatch(f.parts[1])):
            out[m["name"]] = m["abi"]
    return out


def encodes_beside_decord(codec: str) -> bool:
    """Whether PyAV's encoder ``codec`` works in this process: False where decord is imported and
    the encoder's library is one of :func:`decord_clashes` (PyAV older than 17.1)."""
    lib = _CLASHING_ENCODERS.get(codec)
    return lib is None or "decord" not in sys.modules or lib not in decord_clashes()


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


def colour_tags(frame: Any, decoder: Any) -> tuple[int, int]:
    """The colour primaries and transfer (FFmpeg's numbers) of ``frame``, decoded by the codec
    context ``decoder``: the frame's own, or the decoder's where PyAV does not show them on frames."""
    tagged = frame if FRAME_COLOUR else decoder
    return int(tagged.color_primaries), int(tagged.color_trc)


def ffmpeg_logs_to_stderr() -> None:
    """FFmpeg's own log callback, which writes to descriptor 2, in place of PyAV's (which keeps
    the lines from it where PyAV installed one). Called where decord decodes: in a worker."""
    import av.logging

    av.logging.restore_default_callback()


def filter_graph() -> Any:
    """An empty libavfilter graph that runs on one thread: libavfilter otherwise makes each graph
    a pool of a thread per CPU (joined when the graph is freed), so each of W workers would start
    one per core of the machine, and slice-threaded scaling gave frames that differ from run to
    run under load. A PyAV without ``Graph.threads`` keeps the pool, idle: each filter added is
    told ``threads=1`` (libavfilter's option of every filter), so none slices its work over it."""
    g = av.filter.Graph()
    if GRAPH_THREADS:
        g.threads = 1
        return g
    return _OneThreadFilters(g)


class _OneThreadFilters:
    """A graph whose ``add`` tells each filter ``threads=1``; everything else is the graph's."""

    def __init__(self, graph: Any) -> None:
        self._graph = graph

    def add(self, name: str, args: str | None = None, **kwargs: Any) -> Any:
        if kwargs:
            return self._graph.add(name, **kwargs, threads="1")
        return self._graph.add(name, f"{args}:threads=1" if args else "threads=1")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._graph, name)


def boxes_end(f: Any) -> int | None:
    """Where the top-level boxes of the MP4/MOV file ``f`` (seekable, binary) say it ends, where
    that is past its end (a copy cut short); None where they fit, or it is no such file."""
    end = f.seek(0, os.SEEK_END)
    at = 0
    for _ in range(_MAX_BOXES):
        if at >= end:
            return at if at > end else None
        f.seek(at)
        head = f.read(16)
        if len(head) < 8:
            return at + 8
        size, kind = struct.unpack(">I4s", head[:8])
        if kind not in _MP4_BOXES:
            return None
        if size == 1 and len(head) == 16:
            size = struct.unpack(">Q", head[8:])[0]
        elif size == 0:
            return None  # to the end of the file, whatever it holds
        if size < 8:
            return None
        at += size
    return None
