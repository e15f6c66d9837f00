"""What becomes of a sample that cannot be read: ``on_error``'s choices, and the skips kept."""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["ON_ERROR", "SKIPS_KEPT", "Skips"]

# What a loader (or a Ray dataset) does with a sample it cannot read.
ON_ERROR = ("raise", "skip")
# Skipped samples remembered with their reason, by a loader and by a Ray dataset's task log (a
# long run over a damaged dataset must not grow).
SKIPS_KEPT = 10_000


class Skips(deque[tuple[int, int, str]]):
    """``(epoch, sample, reason)`` of the most recent skips, oldest first: a deque that also
    slices (``loader.skipped[:2]``, a list)."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(self)[index]
        return super().__getitem__(index)
