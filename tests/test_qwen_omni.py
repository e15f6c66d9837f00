"""qwen.clips(audio_rate=16000): each video's sound as qwen-omni-utils' process_audio_info extracts it
for Qwen-Omni's use_audio_in_video (librosa over audioread's FFmpeg command line), compared sample
by sample on files written here (AAC 44.1 kHz stereo in MP4, AAC 16 kHz mono starting late, MP3,
PCM in MOV, Opus in WebM), whole and cut by spans, through a loader's worker."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shmloader
from shmloader import qwen

from ._needs import need
from ._qwen import have_torchvision, import_torchvision
from ._sound import write_av

pytestmark = pytest.mark.timeout(180)

# (file, codec, rate, channels, audio_from)
SHAPES = [("aac.mp4", "aac", 44100, 2, 0.0), ("late.mp4", "aac", 16000, 1, 0.3), ("mp3.mp4", "libmp3lame", 44100, 2, 0.0),
          ("pcm.mov", "pcm_s16le", 48000, 2, 0.0), ("opus.webm", "libopus", 48000, 1, 0.0)]


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    """qwen-omni-utils' process_audio_info, its FFmpeg command line being imageio-ffmpeg's build
    (audioread runs `ffmpeg` from PATH)."""
    need("librosa")
    # qwen-omni-utils imports audioread without declaring it (librosa before 1.0 brought it)
    need("audioread", "audioread is not installed (qwen-omni-utils imports it; librosa 1.0 no longer brings it)")
    if not have_torchvision():  # qwen_omni_utils imports its vision half too
        pytest.skip("torchvision is not installed (make test installs it)")
    import_torchvision()
    imageio_ffmpeg = need("imageio_ffmpeg")
    folder = tmp_path_factory.mktemp("ffmpeg-on-path")
    os.symlink(imageio_ffmpeg.get_ffmpeg_exe(), folder / "ffmpeg")
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{folder}{os.pathsep}{path}"
    from qwen_omni_utils.v2_5.audio_process import process_audio_info

    yield process_audio_info
    os.environ["PATH"] = path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("omni")
    return [write_av(folder / name, codec, rate, channels, audio_from=start) for name, codec, rate, channels, start in SHAPES]


def test_the_sound_is_qwen_omni_utils_own(omni, files):
    spans = [None, None, (0.5, 1.5), None, (0.25, None)]
    src = qwen.clips(files, spans=spans, audio_rate=16000)
    with shmloader.Loader(src, batch_size=len(files), workers=1) as loader:
        (batch,) = list(loader)
    offsets, lengths = batch["audio_offsets"], batch["audio_len"]
    for k, i in enumerate(batch["index"].tolist()):
        ele = {"type": "video", "video": files[i]}
        if spans[i] is not None:
            ele["video_start"] = spans[i][0]
            if spans[i][1] is not None:
                ele["video_end"] = spans[i][1]
        (want,) = omni([{"role": "user", "content": [ele]}], use_audio_in_video=True)
        got = batch["audio"][offsets[k] : offsets[k] + lengths[k]]
        # The length the container states for the track; FFmpeg's command line keeps the encoder's
        # end padding in some files (a late-starting AAC track here): up to one codec frame more.
        _, codec, rate, _, _ = SHAPES[i]
        frame = {"aac": 1024, "libmp3lame": 1152, "libopus": 960}.get(codec, 0)
        assert 0 <= len(want) - len(got) <= -(-frame * 16000 // rate) + 1, (SHAPES[i], len(got), len(want))
        n = len(got)
        np.testing.assert_allclose(got, want[:n], atol=2e-3, err_msg=str(SHAPES[i]))  # the last bits may differ by build
        assert not batch["audio"][offsets[k] + lengths[k] : offsets[k + 1]].any()  # room past the sound is zeros
        assert abs(np.abs(want).mean()) > 0.01  # a tone, not silence


def test_a_video_without_sound_is_named(tmp_path):
    from shmloader.samples import write_video

    silent = write_video(tmp_path / "silent.mp4", 1, frames=30)
    src = qwen.clips([silent], audio_rate=16000)
    with shmloader.Loader(src, batch_size=1, workers=1) as loader:
        with pytest.raises(shmloader.SampleError, match=r"silent\.mp4.*no audio stream"):
            list(loader)
