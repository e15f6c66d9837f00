"""Many videos probed before the first batch, as a family plans them (``PlannedVideos``, Open-Sora's
buckets): each video's frames, rate, size as shown and duration, from a scan manifest's rows (no
file opened), from a file of probes kept by an earlier run (a row reused while its file is
unchanged), or probed here: in processes where there are many local files (the probe parses
packets in Python, and threads share one core for it), in threads for remote ones (they wait on
requests), with a progress bar on a terminal. A file that cannot be probed is a row saying why,
which the family leaves out or names (``on_error``); a probe process that dies takes only its
own files' rows with it.
"""

from __future__ import annotations

import ctypes
import csv
import json
import os
import pickle
import selectors
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

from .manifest import iter_manifest
from .media import is_remote
from .probe import probe
from .storage import Storage

__all__ = ["KEPT_COLUMNS", "Row", "manifest_rows", "probe_rows"]

# What one video's plan needs: frames, average rate, height and width as shown, duration (s).
Row = tuple[int, float, int, int, float]
# A file of kept probes: the columns of a ``shmloader scan`` manifest it needs, so either reads
# as the other (``manifest_rows``).
KEPT_COLUMNS = ("path", "frames", "fps", "height", "width", "duration", "bytes", "mtime_ns", "problem")
# Videos probed at once in threads (remote files: requests; or few local files).
_THREADS = 8
# Local files from which the probes go to processes; how long a probe process may go without
# answering before it is killed (its file then a row saying so).
_PROCESSES_FROM = 256
_QUIET_S = 120.0
# Videos from which a terminal shows a progress bar.
_BAR_FROM = 500


def probe_rows(paths: Sequence[str], storage: Storage, *, processes: int | None = None,
               kept: str | os.PathLike[str] | None = None) -> list[Row | str]:
    """Each of ``paths`` as a ``Row``, or why it cannot be probed (a string). ``kept``: a CSV of
    probes, read first (a row whose file's size and modification time are unchanged is used as
    it is) and written after with every video probed (a failure is probed again next time); ``processes``: probe processes for local files
    (None: one per usable CPU where there are many files; 1: threads in this process)."""
    n = len(paths)
    out: list[Row | str | None] = [None] * n
    earlier = _read_kept(os.fspath(kept)) if kept is not None and os.path.exists(kept) else {}
    stamps: dict[int, tuple[int, int]] = {}
    for i, path in enumerate(paths):
        hit = earlier.get(path)
        if hit is not None:
            try:
                stamp = storage.stamp(path)
            except Exception:  # gone or unreachable: probed again, which says why
                continue
            if stamp == hit[1]:
                out[i], stamps[i] = hit[0], stamp
    todo = [i for i in range(n) if out[i] is None]
    for i, row in zip(todo, _probe(paths, todo, storage, processes)):
        out[i] = row
    rows: list[Row | str] = [r if r is not None else "not probed" for r in out]
    if kept is not None and (any(not isinstance(rows[i], str) for i in todo) or len(earlier) != len(stamps)):
        _write_kept(os.fspath(kept), paths, rows, stamps, storage)
    return rows


def _probe(paths: Sequence[str], todo: list[int], storage: Storage, processes: int | None) -> Iterator[Row | str]:
    """The rows of ``paths[todo]``, in order, probed in processes or threads."""
    if not todo:
        return iter(())
    local = not any(is_remote(paths[i]) for i in todo)
    cpus = len(os.sched_getaffinity(0))
    count = processes if processes is not None else (cpus if local and len(todo) >= _PROCESSES_FROM else 1)
    bar = _bar(len(todo))
    if count <= 1 or not local:
        rows = _in_threads([paths[i] for i in todo], storage, bar)
        if bar is not None:
            bar.close()
        return iter(rows)
    rows = _in_processes([paths[i] for i in todo], storage, count, bar)
    if bar is not None:
        bar.close()
    return iter(rows)


def _in_threads(paths: list[str], storage: Storage, bar: Any = None) -> list[Row | str]:
    rows = []
    with ThreadPoolExecutor(min(_THREADS, len(paths))) as pool:
        for row in pool.map(lambda p: _row(p, storage), paths):
            rows.append(row)
            if bar is not None:
                bar.update(1)
    _trim()
    return rows


def _trim() -> None:
    """Give back the free memory the probe threads' malloc arenas keep (glibc keeps one an
    active thread, and their pages stay with the training process: ~8 MB for 6 threads)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def _in_processes(paths: list[str], storage: Storage, count: int, bar: Any) -> list[Row | str]:
    """Rows of ``paths`` probed by ``count`` fresh interpreters (``python -m
    shmloader.video.probing``), each handed its share through a pipe and answering a line a file
    as it goes. A process that dies, or says nothing for ``_QUIET_S`` seconds (killed), leaves
    its file in progress a row saying so; the rest of its share goes to a new process."""
    out: dict[int, Row | str] = {}
    running: dict[int, _Prober] = {}
    selector = selectors.DefaultSelector()

    def start(shares: list[list[int]]) -> None:
        started = [_Prober(share) for share in shares if share]  # all started, then handed their shares
        for prober in started:
            prober.hand(storage, [paths[i] for i in prober.share])
            running[prober.fd] = prober
            selector.register(prober.fd, selectors.EVENT_READ)

    def ended(prober: _Prober, why: str) -> None:
        del running[prober.fd]
        selector.unregister(prober.fd)
        prober.stop()
        left = [i for i in prober.share if i not in out]
        if left and not prober.said:  # it never got going (no interpreter, no shmloader): no file's fault
            for i, row in zip(left, _in_threads([paths[i] for i in left], storage)):
                out[i] = row
            if bar is not None:
                bar.update(len(left))
        elif left:
            out[left[0]] = why
            if bar is not None:
                bar.update(1)
            start([left[1:]])

    try:
        start([list(range(k, len(paths), count)) for k in range(count)])
        while running:
            for key, _ in selector.select(timeout=1.0):
                prober = running[key.fd]
                lines = prober.lines()
                for k, row in lines or ():
                    out[prober.share[k]] = row if isinstance(row, str) else tuple(row)
                if bar is not None and lines:
                    bar.update(len(lines))
                if lines is None:
                    ended(prober, "its probe's process died reading it (the file may crash FFmpeg)")
            for prober in list(running.values()):
                if time.monotonic() - prober.heard > _QUIET_S:
                    ended(prober, f"probing it took more than {_QUIET_S:.0f} s")
    finally:
        for prober in running.values():
            prober.stop()
        selector.close()
    return [out[i] for i in range(len(paths))]


class _Prober:
    """One probe process: its share of the files (positions in the list being probed), what it
    said so far, and when it last said anything."""

    def __init__(self, share: list[int]) -> None:
        self.share = share
        # The parent's sys.path: a script or notebook may have found shmloader by a path it added.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", "shmloader.video.probing"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        self.said = False  # has it answered for a file yet
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.heard = time.monotonic()
        self._partial = b""

    def hand(self, storage: Storage, paths: list[str]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(pickle.dumps((storage, paths)))
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: its pipe says so next
        self.heard = time.monotonic()

    def lines(self) -> list[tuple[int, Any]] | None:
        """The whole lines it wrote since the last call (read from the pipe itself: a buffered
        reader would keep lines the selector cannot see); None once it has closed its end."""
        data = os.read(self.fd, 1 << 16)
        if not data:
            return None
        self.heard = time.monotonic()
        *whole, self._partial = (self._partial + data).split(b"\n")
        self.said = self.said or bool(whole)
        return [tuple(json.loads(line)) for line in whole]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _bar(total: int) -> Any:
    """A progress bar on a terminal (tqdm's, on stderr), where there are many videos; else None."""
    if total < _BAR_FROM:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="video", desc="probing videos", disable=None)


def _row(path: str, storage: Storage) -> Row | str:
    try:
        info = probe(storage.resolve(path), storage=storage)
    except Exception as e:
        return f"cannot read it: {storage.redact(str(e))}"
    return int(info.frames), float(info.fps), int(info.height), int(info.width), float(info.duration)


def _read_kept(kept: str) -> dict[str, tuple[Row | str, tuple[int, int]]]:
    """path -> (its row, or why it could not be probed; the file's (size, mtime_ns) then)."""
    out: dict[str, tuple[Row | str, tuple[int, int]]] = {}
    with open(kept, newline="") as f:
        for row in csv.DictReader(f):
            try:
                stamp = (int(row["bytes"]), int(row["mtime_ns"]))
                frames = int(row["frames"] or 0)
                parsed: Row | str = (frames, float(row["fps"]), int(row["height"]), int(row["width"]),
                                     float(row["duration"])) if frames > 0 else (row["problem"] or "cannot read it")
            except (KeyError, TypeError, ValueError):
                continue  # not a row of ours: probed again
            out[row["path"]] = (parsed, stamp)
    return out


def _write_kept(kept: str, paths: Sequence[str], rows: list[Row | str], stamps: dict[int, tuple[int, int]],
                storage: Storage) -> None:
    """Every row, written to a temporary file beside ``kept`` and moved over it (a run cut short
    leaves the earlier file whole)."""
    folder = os.path.dirname(os.path.abspath(kept))
    fd, tmp = tempfile.mkstemp(prefix=".probes-", suffix=".csv", dir=folder)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(KEPT_COLUMNS)
            for i, (path, row) in enumerate(zip(paths, rows)):
                if isinstance(row, str):
                    continue
                try:
                    size, mtime = stamps[i] if i in stamps else storage.stamp(path)
                except Exception:
                    continue  # gone: nothing to keep
                if not isinstance(row, str):  # a failure is not kept: it may pass next time (a timeout)
                    w.writerow([path, row[0], repr(row[1]), row[2], row[3], repr(row[4]), size, mtime, ""])
        os.replace(tmp, kept)
    except BaseException:
        os.unlink(tmp)
        raise


def manifest_rows(manifest: str | os.PathLike[str], path_column: str = "path", label_column: str | None = None
                  ) -> tuple[list[str], list[int] | None, list[Row | str]]:
    """A ``shmloader scan`` manifest's (or a file of kept probes') paths, labels and rows, as its
    columns give them, no file opened: a row the scan could not read says why (its ``problem``)."""
    paths, labels, rows = [], [], []
    for path, label, row in iter_manifest(os.fspath(manifest), path_column, label_column):
        paths.append(path)
        labels.append(label)
        try:
            frames = int(row.get("frames") or 0)
            parsed: Row | str = (frames, float(row["fps"]), int(row["height"]), int(row["width"]),
                                 float(row.get("duration") or frames / float(row["fps"])))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            frames, parsed = 0, ""
        if frames < 1 or isinstance(parsed, str):
            parsed = f"the manifest has no probe of it ({row.get('problem') or 'no frames'})"
        rows.append(parsed)
    return paths, None if label_column is None else [int(x) for x in labels if x is not None], rows


def _main() -> None:
    """A probe process: its share from stdin (pickled by the process that started it), a JSON
    line a file on stdout, ``[position in the share, row or why not]``, as each is probed."""
    storage, share = pickle.load(sys.stdin.buffer)
    for k, path in enumerate(share):
        print(json.dumps([k, _row(path, storage)]), flush=True)


if __name__ == "__main__":
    _main()
