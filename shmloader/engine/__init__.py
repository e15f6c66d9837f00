"""The engine: runs any source's samples in a pool of worker processes into a shared-memory ring.

What lives here: the ring of slots (``ring``), the worker processes and their start-up (``pool``,
``worker``), the wire format between them (``protocol``), which sample goes to which slot and
worker (``plan``, ``schedule``), the loop that ties them together (``core``), the contract a source
meets (``source``), read-only tables shared with the workers (``shared``), native stderr capture
(``native_log``) and Ctrl-C handling (``interrupts``).

What it may import: the standard library, numpy, psutil, cloudpickle and ``shmloader._errors``.
It knows nothing of video: a source is anything that meets ``source.Source``. Nothing here is
public API; users import from ``shmloader``.
"""
