"""Fixed-format messages between the loader and its workers.

Only these structs cross a pipe after start-up; frames never do. The loader unpacks nothing
else from a worker: an error travels as UTF-8 JSON text of bounded length, never as a pickle;
a reply must match the task it answers (its item count, failure indices in range), and the
worker bounds-checks every slot and position it is given. See NOTE [ Tasks and replies ] in
``engine.schedule`` for what a task and a reply mean.
"""

from __future__ import annotations

import os
import struct

import numpy as np

# loader -> worker: op, number of items; then that many TASK_ITEMs
TASK = struct.Struct("<B3xI")
OP_READ = 1
# one item of a task: slot, position in the batch, sample index, epoch it was drawn in
TASK_ITEM = struct.Struct("<IIqq")
# Items in one task: a whole window of grouped clips fits, a runaway count does not.
MAX_TASK_ITEMS = 1 << 16

# worker -> loader: status, items in the task it answers, failure records that follow, busy seconds,
# then what the source counted while reading them (``COUNTS``, e.g. decodes by decord and by PyAV,
# files probed, bytes fetched from remote storage, frames decoded and delivered, reads timed to
# choose a decoder and the choices made)
DONE = struct.Struct("<B3xIId14Q")
# The source counters a reply carries, in DONE's order (by name from a source's ``counters()``).
COUNTS = ("decord", "pyav", "decoder_fallbacks", "reprobes", "probes", "bytes_read", "requests",
          "frames_decoded", "frames_lead", "frames_head", "frames_delivered", "measured_reads", "chose_decord",
          "chose_pyav")
NO_COUNTS = (0,) * len(COUNTS)
ST_DONE = 0
ST_READY = 2
# one failure record: item index, error payload length; then the payload
FAILURE = struct.Struct("<II")

# An error report (type, message, traceback) is cut to this size: a worker cannot make the
# loader buffer without bound.
MAX_ERROR_BYTES = 64 * 1024


class ProtocolError(Exception):
    """What a worker wrote is not a valid reply; the message says what it was."""


def take_reply(buf: bytearray) -> tuple[int, int, dict[int, bytes], float, tuple[int, ...]] | None:
    """The first whole reply in ``buf`` as (status, item count, failures, busy seconds, counts), removed
    from ``buf``; None while it is still incomplete. Raises ProtocolError on anything malformed
    (counts out of range, an oversized error report), before buffering what it announces."""
    if len(buf) < DONE.size:
        return None
    status, count, nfail, busy, *counts = DONE.unpack_from(buf)
    if nfail > count:
        raise ProtocolError(f"a reply with {nfail} failures for {count} items")
    off, failures = DONE.size, {}
    for _ in range(nfail):
        if len(buf) < off + FAILURE.size:
            return None
        i, plen = FAILURE.unpack_from(buf, off)
        if plen > MAX_ERROR_BYTES:
            raise ProtocolError(f"an error report of {plen} bytes")
        if i >= count or i in failures:
            raise ProtocolError(f"a failure record for item {i} of {count}")
        if len(buf) < off + FAILURE.size + plen:
            return None
        failures[i] = bytes(buf[off + FAILURE.size : off + FAILURE.size + plen])
        off += FAILURE.size + plen
    del buf[:off]
    return status, count, failures, busy, tuple(counts)


ITEMS = np.dtype([("slot", "<u4"), ("pos", "<u4"), ("sample", "<i8"), ("epoch", "<i8")])  # TASK_ITEM as an array
assert ITEMS.itemsize == TASK_ITEM.size


def pack_task(items: list[tuple[int, int, int, int]]) -> bytes:
    return TASK.pack(OP_READ, len(items)) + np.array(items, dtype=ITEMS).tobytes()


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking pipe or file."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
