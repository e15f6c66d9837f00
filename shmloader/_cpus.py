"""The CPUs this process may run on: what sizes every pool of worker processes by default (the
loader's, scan's, prepare's) and what a loader pins its workers to."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (taskset, cgroup cpusets), not all the machine has."""
    return len(os.sched_getaffinity(0)) or 1
