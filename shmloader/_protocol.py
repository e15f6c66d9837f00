"""Fixed-format messages between the loader and its workers.

Only these structs cross a pipe after start-up; frames never do. The loader unpacks nothing
else from a worker: an error travels as UTF-8 JSON text of bounded length, never as a pickle,
and every slot and position is bounds-checked on arrival (see ``_loader``).
"""

from __future__ import annotations

import os
import struct

# loader -> worker: op, slot, position in batch, sample index, epoch
TASK = struct.Struct("<B3xIIqq")
OP_READ = 1

# worker -> loader: status, slot, position, sample index, busy seconds, error payload length
DONE = struct.Struct("<B3xIIqdI")
ST_OK = 0
ST_ERROR = 1
ST_READY = 2

# An error report (type, message, traceback) is cut to this size: a worker cannot make the
# loader buffer without bound.
MAX_ERROR_BYTES = 64 * 1024


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking pipe or file."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
