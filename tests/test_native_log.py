"""decord's and FFmpeg's own log lines: held back from stderr and added to the error they explain."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from shmloader._native_log import is_native

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import sys
    from shmloader import _native_log
    _native_log.capture()
    import decord
    print("progress 50%", end="\\r", file=sys.stderr, flush=True)
    print("a line of the user's own", file=sys.stderr, flush=True)
    try:
        decord.VideoReader(sys.argv[1], width=64, height=64)
    except Exception as e:
        print("message:", _native_log.with_native_lines(str(e)))
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


def test_native_lines_join_the_error_and_leave_stderr(tmp_path):
    out, bad = run(tmp_path)
    message, again = out.stdout.splitlines()
    assert message.startswith(f"message: Error reading {bad}... [decord/FFmpeg: ")
    assert "ERROR opening" in message and "Invalid data found when processing input" in message
    assert again == "again: []"  # taken once
    # Everything that is not decord's or FFmpeg's logging still reaches stderr, as written.
    assert out.stderr.splitlines() == ["progress 50%", "a line of the user's own", "last words"]


def test_opt_out_leaves_stderr_alone(tmp_path):
    out, bad = run(tmp_path, SHMLOADER_NATIVE_LOG="stderr")
    assert out.stdout.splitlines()[0] == f"message: Error reading {bad}..."
    assert "Invalid data found when processing input" in out.stderr and "ERROR opening" in out.stderr


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
    logged = [line for line in out.stderr.splitlines() if line.startswith("LOG shmloader skipped sample 1")]
    assert len(logged) == 1 and "Invalid data found when processing input" in logged[0], out.stderr
    assert [line for line in out.stderr.splitlines() if is_native(line)] == []
