"""VideoClips' options, each stated once (``shmloader/clips/options.py``): every field of a group is
a keyword of the constructor, is in ``options()``, comes back through ``with_options``, changes the
digest, and is documented; a group given whole is the same description as its keywords."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import typing

import pytest

import shmloader
from shmloader.clips.description import VideoClips
from shmloader.clips.options import GROUPS, KEYWORDS, OptionKeywords
from shmloader.clips.reader import Clips
from shmloader.video.identity import digest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# No file is read: a size is given and audio_seconds set, so nothing is probed.
PATHS = ["a.mp4", "b.mp4"]
BASE = dict(clip_len=4, size=(48, 64), audio_rate=16000, audio_seconds=1.0)

# Every option by its keyword: a value other than BASE's, and what else must change with it.
CHANGED = {
    "sampling": ("uniform", {}),
    "clip_len": (8, {}),
    "frame_step": (2, {}),
    "fps": (5.0, {}),
    "max_frames": (8, dict(clip_len=None, fps=5.0)),
    "clips_per_video": (2, {}),
    "clips_per_sample": (2, {}),
    "short_video": ("wrap", {}),
    "size": ((32, 48), {}),
    "scale": ((40, 48), dict(size=None, crop=(32, 32))),
    "crop": ((32, 32), {}),
    "crop_at": ("random", dict(crop=(32, 32))),
    "audio_rate": (8000, {}),
    "audio_channels": (2, {}),
    "audio_seconds": (0.5, {}),
    "decoder": ("pyav", {}),
    "decode_threads": (2, {}),
    "group_clips": (True, {}),
    "storage_options": ({"anon": True}, {}),
    "fetch": ({"retries": 2}, {}),
    "allow_urls": (True, {}),
}


def _group_fields():
    return [(g, f) for g, cls in GROUPS.items() for f in dataclasses.fields(cls)]


def test_every_field_is_a_keyword_of_the_constructor():
    """The typed keywords (``OptionKeywords``, what type checkers see) are the groups' fields, with
    the fields' types; each group is an argument and an attribute of ``VideoClips`` and of what
    the reader reads (``reader.Clips``)."""
    assert set(KEYWORDS) == {*OptionKeywords.__annotations__, "sampling"}
    typed = typing.get_type_hints(OptionKeywords)
    for g, f in _group_fields():
        keyword = f.metadata.get("keyword", f.name)
        if keyword in typed:  # a group's key field takes None too: no such group (audio_rate=None)
            hint = typing.get_type_hints(GROUPS[g], include_extras=True)[f.name]
            assert typed[keyword] in (hint, hint | None), keyword
    params = inspect.signature(VideoClips).parameters
    for g in GROUPS:
        assert g in params and g in typing.get_type_hints(VideoClips) and g in Clips.__annotations__, g
    assert typing.get_type_hints(VideoClips)["audio"] == typing.Optional[shmloader.Audio]


def test_every_option_is_in_options_comes_back_and_changes_the_digest():
    assert set(CHANGED) == set(KEYWORDS), "a new option needs its row here"
    base = VideoClips(PATHS, **BASE)
    for keyword, (value, also) in CHANGED.items():
        changed = base.with_options(**{keyword: value, **also})
        g, name = KEYWORDS[keyword]
        assert changed.options()[keyword] == value, keyword
        assert getattr(getattr(changed, g), name) == value, keyword
        assert digest(changed) != digest(base.with_options(**also)), keyword
        again = VideoClips(changed.paths, **changed.options())
        assert digest(again) == digest(changed) and again.spec() == changed.spec(), keyword


def test_a_group_given_whole_is_its_keywords():
    flat = VideoClips(PATHS, clip_len=8, sampling="uniform", crop=(32, 32), scale=40, audio_rate=8000,
                      audio_seconds=1.0, decoder="pyav")
    whole = VideoClips(PATHS, sampling=shmloader.Sampling(clip_len=8, mode="uniform"),
                       pixels=shmloader.Pixels(crop=(32, 32), scale=40),
                       audio=shmloader.Audio(rate=8000, seconds=1.0), reading=shmloader.Reading(decoder="pyav"))
    assert digest(flat) == digest(whole) and flat.options() == whole.options()
    assert (whole.sampling.clip_len, whole.pixels.scale, whole.audio.rate) == (8, (40, 40), 8000)
    assert whole.with_options(pixels=shmloader.Pixels(size=(32, 32))).pixels.size == (32, 32)


def test_an_option_given_twice_or_misspelt_is_refused():
    with pytest.raises(ValueError, match="clip_len and sampling= given together"):
        VideoClips(PATHS, sampling=shmloader.Sampling(clip_len=8), clip_len=4, size=(8, 8))
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip_length'; did you mean 'clip_len'"):
        VideoClips(PATHS, clip_length=8, size=(8, 8))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="pixels must be a Pixels"):
        VideoClips(PATHS, pixels=(8, 8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="audio_channels needs audio_rate="):
        VideoClips(PATHS, size=(8, 8), audio_channels=2)
    with pytest.raises(ValueError, match="max_frames and clip_len exclude each other"):
        shmloader.Sampling(clip_len=8, max_frames=8, fps=2)


def test_no_audio_takes_its_options_with_it():
    clips = VideoClips(PATHS, **BASE)
    quiet = clips.with_options(audio_rate=None)
    assert quiet.audio is None and "audio" not in quiet.spec() and quiet.audio_samples == 0
    assert (quiet.options()["audio_channels"], quiet.options()["audio_seconds"]) == (1, None)
    assert clips.with_options(audio=None).options() == quiet.options()
    assert quiet.with_options(audio_rate=8000, audio_seconds=0.5).audio == shmloader.Audio(rate=8000, seconds=0.5)


def test_every_field_is_documented_once_and_on_the_api_page():
    """Each field has its docstring in its group's module (the API reference renders it); the
    reference shows each group."""
    tree = ast.parse((ROOT / "shmloader" / "clips" / "options.py").read_text())
    tree.body += ast.parse((ROOT / "shmloader" / "video" / "reading.py").read_text()).body  # Reading, the house's
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in {c.__name__ for c in GROUPS.values()}:
            body = node.body
            for i, item in enumerate(body):
                if isinstance(item, ast.AnnAssign):
                    after = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant), \
                        f"{node.name}.{item.target.id} has no docstring"
    page = (ROOT / "docs" / "api" / "sources.md").read_text()
    for cls in GROUPS.values():
        assert f"::: shmloader.{cls.__name__}" in page, cls.__name__
