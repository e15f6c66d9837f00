"""What a video worker imports before its first read, imported once by the fork server
(``engine.forkserver``) so that each worker it forks has them: PyAV, decord without the CUDA stack
(``video.decord.import_decord``), and the reading path (a family's own modules are its source's ``worker_imports``). No reader is opened here, and none of
these imports starts a thread."""

import av  # noqa: F401

from . import decoding, stamps  # noqa: F401
from .decord import import_decord

import_decord()
