"""What a ``VideoClips`` is given besides its options and the checks every family shares
(``video.arguments``): the first video as the training process reads it (its native size, the
frame rate that sets the audio's room), the rows of one file, a class folder's videos."""

from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from ..video.manifest import walk_folder
from ..video.probe import VideoInfo, probe
from ..video.storage import Storage
from .options import Audio, Sampling

__all__ = ["FirstVideo", "audio_samples", "class_videos", "first_rows"]


class FirstVideo:
    """The first video as the main process reads it (as a worker would), probed when first asked
    and once however often: ``size=None`` asks its native size, audio without ``audio_seconds``
    its frame rate, one ``VideoClips`` both."""

    def __init__(self, path: str, storage: Storage) -> None:
        self.path, self.storage = path, storage
        self._info: VideoInfo | None = None

    def info(self, why: str) -> VideoInfo:
        """The probe; a ValueError starting with ``why`` (the argument that needs it) where the
        file cannot be read."""
        if self._info is None:
            try:
                self._info = probe(self.path, storage=self.storage)
            except Exception as e:
                raise ValueError(f"{why} of {self.storage.name(self.path)!r}: "
                                 f"{self.storage.redact(str(e))}") from e
        return self._info

    def native_size(self) -> tuple[int, int]:
        info = self.info("size=None: cannot read the native size")
        return info.height, info.width


def first_rows(paths: list[str]) -> np.ndarray:
    """For every row, the index of the first row with the same path."""
    first: dict[str, int] = {}
    return np.fromiter((first.setdefault(p, i) for i, p in enumerate(paths)), np.int64, len(paths))


def class_videos(root: str, extensions: Sequence[str]) -> list[tuple[str, int]]:
    """(path, label) of the videos in ``root``'s class folders; ValueError saying what is there
    instead where there are none."""
    if not os.path.isdir(root):
        raise ValueError(f"{root!r} is not a folder")
    found = list(walk_folder(root, extensions))
    if found:
        return found
    loose = [p for p, _ in walk_folder(root, extensions, loose=True)]
    if loose:
        raise ValueError(f"{root!r} holds {len(loose)} videos but no class sub-folders: from_folder "
                         "labels each video by its folder (root/<class>/<video>). For videos without "
                         f"labels, VideoClips(paths) with the paths, e.g. sorted(glob.glob({os.path.join(root, '*')!r}))")
    raise ValueError(f"no videos ({', '.join(extensions)}) in class folders under {root!r}")


def audio_samples(sampling: Sampling, audio: Audio | None, first: FirstVideo) -> int:
    """``S``, the samples every clip's audio has room for (NOTE [ Where a clip's audio lies ]);
    0 without audio. Clips by index and no ``audio_seconds``: by the frame rate of the first
    video (``first``: probed once, for its size too)."""
    if audio is None:
        return 0
    seconds = audio.seconds
    if seconds is None and sampling.fps is not None:
        seconds = (sampling.length + 1) / sampling.fps
    elif seconds is None:
        rate = first.info("audio_rate: cannot read the frame rate that sets the audio's length "
                          "(or pass audio_seconds=)").fps
        if not rate > 0:
            raise ValueError(f"audio_rate: {first.storage.name(first.path)!r} has no frame rate to set the "
                             "audio's length by: pass audio_seconds=")
        seconds = ((sampling.length - 1) * sampling.frame_step + 1) / rate
    # A span of exactly `seconds` at a rate that rounds is not one sample longer.
    return max(1, math.ceil(seconds * audio.rate - 1e-6))
