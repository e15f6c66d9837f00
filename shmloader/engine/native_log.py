"""What decord and FFmpeg print in a worker, kept for the error of the sample that made them print it.

decord's exceptions say little (``RuntimeError: Error reading /v.mp4...``): the reason (``moov
atom not found``, ``Invalid data found when processing input``) goes from FFmpeg's and decord's
own loggers straight to file descriptor 2, once per bad file, from every worker, apart from the
error the loader reports. In a worker, :func:`capture` points descriptor 2 at a pipe that a
thread reads: lines that are decord's or FFmpeg's log lines are held back, and everything else
(Python tracebacks, ``faulthandler``, a user's own prints to ``sys.stderr``) goes on to the real
stderr unchanged. :func:`take` returns the held lines and forgets them: the worker calls it when
a task starts (dropping what a sample that decoded fine printed) and adds what it returns to the
error it reports, so the reason reaches the consumer inside the ``SampleError`` and the skip
warning on the ``shmloader`` logger.

``SHMLOADER_NATIVE_LOG=stderr`` leaves descriptor 2 alone: every line goes to stderr as it comes.

Wiring (``engine.worker``): ``capture()`` once at start-up, before the source's ``worker_init``;
``take()`` when a task arrives; ``with_native_lines(message)`` for the message of an error report.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import threading
from collections import deque

__all__ = ["capture", "capturing", "take", "with_native_lines", "is_native", "damage_seen"]

# "[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55c88e413dc0] moov atom not found" (FFmpeg's av_log) and
# "[08:22:23] /project/src/video/video_reader.cc:86: ERROR opening: ..." (decord's C++ logger).
_NATIVE = re.compile(r"^\[[^\]]* @ 0x[0-9a-fA-F]+\] |^\[\d\d:\d\d:\d\d\] \S+:\d+: ")
# A decoder's complaint about the bitstream ("[h264 @ 0x...] error while decoding MB 0 8",
# "Invalid NAL unit size", "concealing 396 DC errors"): decord goes on after these and may hand
# back a neighbouring frame in place of the damaged one.
_DAMAGE = re.compile(r"^\[\w+ @ 0x[0-9a-fA-F]+\] .*(error|invalid|corrupt|conceal|missing|illegal|overread)", re.I)
# Lines held for one task: a damaged file makes FFmpeg print a few; a pathological one, many.
_KEPT = 20
# A line longer than this is passed on or held in pieces rather than buffered without bound.
_MAX_LINE = 8192


def is_native(line: str) -> bool:
    return bool(_NATIVE.match(line))


class _Capture:
    def __init__(self) -> None:
        self.read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.read_fd, False)
        self.stderr = os.dup(2)  # the real stderr, for everything that is not native logging
        os.set_inheritable(self.stderr, False)
        os.dup2(write_fd, 2)  # fd 2 itself stays inheritable, as stderr always is
        os.close(write_fd)
        self.lock = threading.Lock()
        self.partial = b""
        self.held: deque[str] = deque(maxlen=_KEPT)
        self.damage = 0  # decoder complaints seen since start-up
        threading.Thread(target=self._pump, name="shmloader-native-log", daemon=True).start()

    def _pump(self) -> None:
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        while True:
            poller.poll()
            with self.lock:
                if not self._drain():
                    return  # every writer closed it: the process is exiting

    def _drain(self) -> bool:
        """Read what is in the pipe now and sort it into lines; False at end of file."""
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self._lines(self.partial + chunk)

    def _lines(self, data: bytes) -> None:
        *lines, self.partial = data.split(b"\n")
        if len(self.partial) > _MAX_LINE:
            lines.append(self.partial)
            self.partial = b""
        for raw in lines:
            text = raw.decode("utf-8", "replace").rstrip("\r")
            if is_native(text):
                self.held.append(text)
                self.damage += bool(_DAMAGE.match(text))
            else:
                _write_all(self.stderr, raw + b"\n")
        if self.partial and not self.partial.startswith(b"["):
            # Cannot be a native log line (those start with "["): pass it on now, e.g. a
            # progress bar, which has no newline to wait for.
            _write_all(self.stderr, self.partial)
            self.partial = b""

    def flush(self) -> None:
        """At exit: sort what is left; a traceback printed just before must not be lost."""
        with self.lock:
            self._drain()
            if self.partial:
                self._lines(self.partial + b"\n")

    def take(self) -> list[str]:
        with self.lock:
            self._drain()  # lines written before this call are in the pipe or already sorted
            if self.partial and is_native(self.partial.decode("utf-8", "replace")):
                self.held.append(self.partial.decode("utf-8", "replace"))
                self.partial = b""
            held = list(self.held)
            self.held.clear()
            return held


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])
        except OSError:
            return  # stderr is gone: nothing to tell anyone


_capture: _Capture | None = None


def capture() -> None:
    """In a worker: hold decord's and FFmpeg's log lines back for :func:`take`. Idempotent."""
    global _capture
    if _capture is None and os.environ.get("SHMLOADER_NATIVE_LOG") != "stderr":
        _capture = _Capture()
        atexit.register(_capture.flush)


def capturing() -> bool:
    """Whether :func:`capture` holds this process's native log lines (in a loader's worker)."""
    return _capture is not None


def take() -> list[str]:
    """The native log lines printed since the last call (none without :func:`capture`)."""
    return _capture.take() if _capture is not None else []


def damage_seen() -> int:
    """How many decoder complaints about damaged data were printed so far (0 without
    :func:`capture`): compare the count before and after a decode to learn whether it met any."""
    if _capture is None:
        return 0
    with _capture.lock:
        _capture._drain()  # a line written before this call is in the pipe, if not sorted yet
        return _capture.damage


def with_native_lines(message: str) -> str:
    """``message`` followed by what decord and FFmpeg printed meanwhile, if anything."""
    lines = take()
    if not lines:
        return message
    return f"{message} [decord/FFmpeg: {' | '.join(_strip(line) for line in lines)}]"


def _strip(line: str) -> str:
    """Drop the logger's own prefix (time and source file, or FFmpeg's context pointer)."""
    m = re.match(r"^\[\d\d:\d\d:\d\d\] \S+:\d+: (.*)$", line)
    if m:
        return m.group(1)
    m = re.match(r"^\[([^\]]*?) @ 0x[0-9a-fA-F]+\] (.*)$", line)
    return f"{m.group(1)}: {m.group(2)}" if m else line
