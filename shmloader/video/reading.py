"""How every family's workers read its files (``Reading``): where they live (local files, or
fsspec URLs with the filesystem's options), how remote bytes are fetched, which decoder decodes
them and with how many threads; the storage and the decoders those options set up. One group of
options the house gives every family by the same keywords (NOTE [ A family of samples ] in
``engine.source``); ``VideoClips`` takes it beside its own groups (``clips.options``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from .._checks import check_bool, check_choice, check_int
from .probe import DECODERS
from .storage import Storage

if TYPE_CHECKING:
    from .decoding import Decoding
    from .measuring import Measuring

__all__ = ["DECODER_CHOICES", "FETCH_OPTIONS", "Reading"]

DECODER_CHOICES = ("auto", *DECODERS)
FETCH_OPTIONS = ("retries", "timeout", "block_size", "cache_bytes", "stat_ttl")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """How the workers read the files: where they live (local files, or fsspec URLs with the
    filesystem's options), how remote bytes are fetched, which decoder decodes them, and which
    samples one worker decodes together."""

    decoder: str = "auto"
    """``"auto"`` lets each file's probe choose — decord only in the (container, codec) shapes
    whose random access is shown exact, and there not for long videos, edit lists that drop
    frames, size changes, rotation, a frame count the container contradicts, and any file decord
    refuses; PyAV for everything else, and every remote file (NOTE [ Which decoder reads a file ]
    in ``video.probe``); ``"decord"`` (local files only) or ``"pyav"`` forces one. Frame counts,
    indices and timestamps are the probe's whichever decoder runs."""
    decode_threads: int = 1
    """Threads each worker's decoder uses (1: the workers are the parallelism)."""
    group_clips: bool = False
    """Decode the ``clips_per_video`` samples of a video together, in one pass by one worker, and
    place them at several positions of the coming batches (the loader's shuffle window)."""
    storage_options: Mapping[str, Any] | None = None
    """Options of the fsspec filesystem that reads remote paths (credentials, endpoint), or one
    dict per protocol."""
    fetch: Mapping[str, Any] | None = None
    """Remote reads, per worker: ``retries`` (5, backoff from 0.1 s), ``timeout`` (30 s a
    request), ``block_size`` (128 KiB), ``cache_bytes`` (64 MiB), ``stat_ttl`` (60 s: how long a
    file's size and mtime are trusted before asked again). A remote file is read by byte range,
    only what a clip needs (NOTE [ Reading remote files ] in ``video.storage``)."""
    allow_urls: bool = False
    """Hand other strings with a protocol prefix (FFmpeg's ``concat:``, ``pipe:``...) to FFmpeg;
    refused otherwise."""

    def __post_init__(self) -> None:
        check_choice("decoder", self.decoder, DECODER_CHOICES)
        check_int("decode_threads", self.decode_threads, 1)
        check_bool("group_clips", self.group_clips)
        check_bool("allow_urls", self.allow_urls)
        fetch = dict(self.fetch or {})
        if set(fetch) - set(FETCH_OPTIONS):
            raise ValueError(f"fetch takes {FETCH_OPTIONS}, got {sorted(set(fetch) - set(FETCH_OPTIONS))}")
        _set(self, decode_threads=int(self.decode_threads), fetch=fetch,
             storage_options=dict(self.storage_options or {}))

    def storage(self) -> Storage:
        """The files' storage as these options set it up (``video.storage``)."""
        return Storage(self.storage_options, **(self.fetch or {}))

    def decoding(self, storage: Storage, measuring: Measuring | None = None) -> Decoding:
        """A worker's decoders as these options set them up (``video.decoding``), reading through
        ``storage`` (this one's, made once by the description); every family's reader makes its
        own here. ``measuring``: the decoder measured per shape of file (``decoder="auto"``)."""
        from .decoding import Decoding

        return Decoding(self.decode_threads, self.decoder, storage, measuring)


def _set(obj: Any, **values: Any) -> None:
    """Normalised values into a frozen group, while it is made."""
    for k, v in values.items():
        object.__setattr__(obj, k, v)
