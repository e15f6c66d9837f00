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
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import av

__all__ = ["open_input", "fraction", "ffmpeg_logs_to_stderr", "AV_MAJOR"]

AV_MAJOR = int(av.__version__.split(".")[0])
_OPEN_OPTIONS: dict[str, Any] = {} if AV_MAJOR >= 19 else {"metadata_errors": "ignore"}


def open_input(source: Any) -> Any:
    """``av.open(source)`` for reading, with the options of this av version (an InputContainer)."""
    return av.open(source, **_OPEN_OPTIONS)


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
