"""decord's and FFmpeg's own log lines: held back from stderr and added to the error they explain."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmloader
from shmloader.engine.native_log import is_native

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import sys
    from shmloader.engine import native_log as _native_log
    _native_log.capture()
    import decord
    print("progress 50%", end="\\r", file=sys.stderr, flush=True)
    print("a line of the user's own", file=sys.stderr, flush=True)
    try:
        decord.VideoReader(sys.argv[1], width=64, height=64)
    except Exception as e:
        print("message:", _native_log.with_native_lines(str(e)))
        print("plain:", e)
    print("again:", _native_log.take())
    raise SystemExit("last words")  # printed to stderr while the interpreter exits
""")


def run(tmp_path, **env):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"this is not a video\n" * 200)  # the same reason every time, unlike random bytes
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(bad)], capture_output=True, text=True, timeout=50,
                         env={**os.environ, **env})
    assert out.returncode == 1, out.stderr
    return out, str(bad)


# decord's and FFmpeg's own wording changes with their versions: the tests below assert what
# shmloader does with their lines (where they go, the brackets it adds), not what they say.
HELD = " [decord/FFmpeg: "


def test_native_lines_join_the_error_and_leave_stderr(tmp_path):
    out, bad = run(tmp_path)
    message, plain, again = out.stdout.splitlines()
    error = plain.removeprefix("plain: ")  # the exception's own message
    assert bad in error and message.startswith(f"message: {error}{HELD}") and message.endswith("]")
    held = message[len(f"message: {error}{HELD}") : -1].split(" | ")
    assert held and all(line and not line.startswith("[") for line in held)  # their prefixes dropped
    assert again == "again: []"  # taken once
    # No line of decord's or FFmpeg's reached stderr; everything else did, as written.
    assert not [line for line in out.stderr.splitlines() if is_native(line)], out.stderr
    # (text mode reads the progress line's "\r" as a line end)
    assert "progress 50%\na line of the user's own\n" in out.stderr and out.stderr.endswith("last words\n")


def test_opt_out_leaves_stderr_alone(tmp_path):
    out, bad = run(tmp_path, SHMLOADER_NATIVE_LOG="stderr")
    message, plain, again = out.stdout.splitlines()
    assert message == f"message: {plain.removeprefix('plain: ')}"  # nothing held back
    assert [line for line in out.stderr.splitlines() if is_native(line)], out.stderr  # it went to stderr


@pytest.mark.parametrize("line, native", [
    ("[mov,mp4,m4a,3gp,3g2,mj2 @ 0x559becb78700] moov atom not found", True),
    ("[h264 @ 0x7f00] mmco: unref short failure", True),
    ("[08:22:23] /project/src/video/video_reader.cc:86: ERROR opening: /v.mp4, Invalid data", True),
    ("Traceback (most recent call last):", False),
    ("[info] a user's own bracketed line", False),
])
def test_what_counts_as_native(line, native):
    assert is_native(line) is native


def test_bad_file_reason_reaches_the_skip_warning_not_stderr(videos, tmp_path):
    paths, _ = videos
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"this is not a video\n" * 200)
    script = tmp_path / "skip.py"
    script.write_text(textwrap.dedent(f"""
        import logging, shmloader
        logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s")
        clips = shmloader.VideoClips([{paths[0]!r}, {str(bad)!r}], clip_len=4, size=(32, 40))
        with shmloader.Loader(clips, batch_size=2, workers=1, on_error="skip") as loader:
            print(sum(len(b["index"]) for b in loader))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
    logged = [line for line in out.stderr.splitlines() if line.startswith("LOG shmloader skipped sample 1 ")]
    assert len(logged) == 1, out.stderr
    # "skipped sample 1 ('<path>'): <exception type>: <why>"
    assert re.fullmatch(rf"LOG shmloader skipped sample 1 \({re.escape(repr(str(bad)))}\): [\w.]+: .*\w.*", logged[0])
    assert [line for line in out.stderr.splitlines() if is_native(line)] == []


def chatty(i, rng):
    """Samples 0 and 2 print a line as FFmpeg would; 0 and 3 fail."""
    if i in (0, 2):
        os.write(2, f"[h264 @ 0x55d0c0ffee00] sample {i} was here\n".encode())
    if i in (0, 3):
        raise ValueError(f"sample {i} failed")
    return {"x": np.int64(i)}


def test_a_worker_adds_a_samples_native_lines_to_its_error_only(capfd):
    """In a real worker: a failing sample's error carries the lines printed while it was read,
    and no later sample inherits them, nor the lines of a sample that was read fine."""
    src = shmloader.FunctionSource(chatty, {"x": ((), np.int64)}, 5, check=False)
    with shmloader.Loader(src, batch_size=1, workers=1, on_error="skip") as loader:
        assert [int(b["x"][0]) for b in loader] == [1, 2, 4]
        reasons = {sample: reason for _, sample, reason in loader.skipped}
    assert reasons == {0: f"ValueError: sample 0 failed{HELD}h264: sample 0 was here]",
                       3: "ValueError: sample 3 failed"}
    assert "was here" not in capfd.readouterr().err  # held back from the worker's stderr
