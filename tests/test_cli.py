"""The command line: ``shmloader make-videos DIR`` and a small ``shmloader demo``, as a user runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shmloader.video.samples import read_codes

pytestmark = pytest.mark.timeout(180)


def cli(*args: str, entry: str = "module"):
    if entry == "script":  # the console script pip installed next to this interpreter
        script = Path(sys.executable).with_name("shmloader")
        if not script.exists():
            pytest.skip(f"no console script at {script}: shmloader is not installed in this environment")
        cmd = [str(script), *args]
    else:
        cmd = [sys.executable, "-m", "shmloader", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=150)


@pytest.mark.parametrize("entry", ["script", "module"])
def test_make_videos_writes_videos_that_say_who_they_are(tmp_path, entry):
    import decord

    out = cli("make-videos", str(tmp_path / "v"), "--count", "3", "--frames", "12", "--size", "64x80",
              entry=entry)
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert len(paths) == 3 and all(Path(p).is_file() for p in paths)
    for i, p in enumerate(paths):
        reader = decord.VideoReader(p)
        assert len(reader) == 12
        frames = reader.get_batch([0, 5, 11]).asnumpy()
        assert frames.shape == (3, 64, 80, 3)
        ids, numbers = read_codes(frames)
        assert ids.tolist() == [i, i, i] and numbers.tolist() == [0, 5, 11]


def test_demo_prints_its_own_output_only(tmp_path):
    """No TensorFlow start-up log lines: a new user sees the demo's table (and real warnings)."""
    fresh_shell = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    out = subprocess.run([sys.executable, "-m", "shmloader", "demo", "--videos", str(tmp_path), "--count", "2",
                          "--workers", "1", "--batches", "2", "--size", "32x40"],
                         capture_output=True, text=True, timeout=150, env=fresh_shell)
    assert out.returncode == 0, out.stderr
    assert "clips/s" in out.stdout and "through loader.as_dataset()" in out.stdout
    noise = [line for line in out.stderr.replace("\r", "\n").splitlines()
             if line and not line.startswith("streaming")]  # tqdm's progress bar is the demo's own
    assert noise == [], noise


def test_no_command_names_the_commands():
    out = cli()
    assert out.returncode == 2
    for command in ("demo", "scan", "prepare", "make-videos"):
        assert re.search(rf"^ +{command}\b", out.stderr, re.M), out.stderr
    assert "shmloader COMMAND --help" in out.stderr and "required: cmd" not in out.stderr, out.stderr


@pytest.mark.parametrize("args", [["--help"], ["demo", "--help"], ["scan", "--help"], ["prepare", "--help"],
                                  ["make-videos", "--help"]])
def test_help_is_plain_text(args):
    """No reST markup (``code``) in what a terminal shows; every option says what it does."""
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    assert "``" not in out.stdout and ":class:" not in out.stdout, out.stdout


def test_every_option_says_what_it_does():
    import argparse

    from shmloader._cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        bare = [a.dest for a in sub._actions if not a.help]
        assert not bare, (name, bare)
        # an option with a default says it (scan's --timeout did not)
        quiet = [a.dest for a in sub._actions if a.default not in (None, False, argparse.SUPPRESS)
                 and "default" not in a.help]
        assert not quiet, (name, quiet)


def test_demo_accounts_for_its_time_and_says_what_next(tmp_path):
    """Where the seconds before the first batch go (TensorFlow's import; the workers' start, inside
    the first batch's time), the ratio with the machine's load beside it, and what to try next."""
    out = cli("demo", "--videos", str(tmp_path), "--count", "2", "--workers", "1", "1", "--batches", "2",
              "--size", "32x40")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(re.fullmatch(r"TensorFlow imported in \d+\.\d s", line) for line in lines), out.stdout
    assert "first batch: seconds from Loader() to the first batch, the workers' start included" in out.stdout
    header = next(line for line in lines if "clips/s" in line)
    assert header.endswith("first batch s"), header
    ratio = next(line for line in lines if " / 1 worker" in line)
    assert "load average" in ratio and "between runs" in ratio, ratio
    assert lines[-1].startswith("next: ") and "shmloader scan" in lines[-1], lines[-1]


def test_make_clean_removes_what_the_tools_leave():
    """``make clean`` (dry run) removes the caches and build output that make test, mypy and an
    editable install leave in the clone, and nothing that is committed."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["make", "-n", "clean"], cwd=root, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    removed = set(out.stdout.split())
    for left in (".venv", ".venv-newest-*", ".venv-oldest-*", ".pytest_cache", ".mypy_cache", "shmloader.egg-info", "build", "dist", "site"):
        assert left in removed, (left, out.stdout)
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True).stdout.split()
    assert not [p for p in tracked if p.split("/")[0] in removed], out.stdout


@pytest.mark.parametrize("args, option", [
    (("make-videos", "DIR", "--frames", "0"), "--frames: 0 is less than 1"),
    (("make-videos", "DIR", "--size", "0x0"), "--size: '0x0': height and width must be at least 1"),
    (("make-videos", "DIR", "--count", "two"), "--count: 'two' is not a whole number"),
    (("scan", "DIR", "--workers", "0"), "--workers: 0 is less than 1"),
    (("scan", "DIR", "--timeout", "-1"), "--timeout: -1 is not a positive number of seconds"),
    (("demo", "--batches", "0"), "--batches: 0 is less than 1"),
    (("prepare", "DIR", "--out", "DIR", "--gop", "0"), "--gop: 0 is less than 1"),
    (("prepare", "DIR", "--out", "DIR", "--size", "128x"), "--size: '128x' is not HxW"),
    (("prepare", "DIR", "--out", "DIR", "--short-side", "1"), "--short-side: 1 is less than 2"),
    (("prepare", "DIR", "--out", "DIR", "--short-side", "128", "--size", "128x171"),
     "--size: not allowed with argument --short-side"),
])
def test_numbers_out_of_range_are_refused_in_one_line(tmp_path, args, option):
    """argparse refuses them before anything runs: exit 2, one line naming the option, no traceback,
    nothing written (a --timeout of -1 once filled a manifest with rows that outlived the run)."""
    out = cli(*[str(tmp_path / "v") if a == "DIR" else a for a in args])
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "--help" in lines[0], out.stderr
    assert not os.path.exists(tmp_path / "v") and not os.path.exists("manifest.csv.scanning")


def test_bad_storage_options_name_the_option(tmp_path):
    out = cli("scan", str(tmp_path), "--out", str(tmp_path / "m.csv"), "--storage-options", "{bad")
    assert out.returncode == 2 and "--storage-options is not JSON" in out.stderr and "Traceback" not in out.stderr
    out = cli("scan", str(tmp_path), "--out", str(tmp_path / "m.csv"), "--storage-options", "[1]")
    assert out.returncode == 2 and "--storage-options must be a JSON object" in out.stderr
    out = cli("prepare", str(tmp_path), "--out", str(tmp_path / "d"), "--storage-options", "[1]")
    assert out.returncode == 2 and "--storage-options must be a JSON object" in out.stderr


def test_demo_without_tensorflow_names_the_extra(tmp_path):
    """As where TensorFlow is not installed (the import system finds no spec for it)."""
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "from shmloader._cli import main\n"
            f"sys.exit(main(['demo', '--videos', {str(tmp_path)!r}, '--count', '1']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    assert out.returncode == 2, out.stderr
    assert "needs tensorflow" in out.stderr and "[tf,samples]" in out.stderr and "Traceback" not in out.stderr
    assert not os.listdir(tmp_path)  # nothing written before the refusal


def hint_of(stderr: str) -> list[str]:
    """scan's lines that say preparing pays: the reason, then the command."""
    lines = stderr.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("one clip per sample over these files:")]
    return lines[at[0]:at[0] + 2] if at else []


def test_scan_says_when_preparing_pays_with_a_command_that_runs(tmp_path):
    """Long-GOP files (one keyframe in 72 frames) and large ones (a short side of 272) get the
    `shmloader prepare` command of the scan's own inputs; small short-GOP files get no hint. The
    command runs as printed, from where the scan ran, and writes copies with a keyframe every 16,
    whose scan says nothing more."""
    from shmloader.samples import write_video
    from shmloader.video.probe import probe

    sets = {"long": ((64, 80), 72, 72), "short": ((64, 80), 8, 24), "large": ((272, 352), 8, 24)}
    for name, (size, gop, frames) in sets.items():
        (tmp_path / name).mkdir()
        for i in range(2):
            write_video(tmp_path / name / f"v{i}.mp4", i, frames=frames, size=size, gop=gop)
    hints = {}
    for name in sets:
        out = subprocess.run([sys.executable, "-m", "shmloader", "scan", name, "--out", f"{name}.csv",
                              "--workers", "1", "--quiet"], capture_output=True, text=True, timeout=150,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stderr.splitlines()[-1].startswith("next: "), out.stderr
        hints[name] = hint_of(out.stderr)
    assert hints["short"] == []
    why, command = hints["long"]
    assert "a keyframe every 72 frames (median): a random clip decodes from the keyframe before it" in why, why
    assert "short side" not in why  # 64 pixels: a copy at short side 128 would be larger
    assert command == "  shmloader prepare long --out long-prepared --gop 16", command
    why, command = hints["large"]
    assert "a short side of 272 pixels (median): 5x the pixels of a copy at short side 128" in why, why
    assert "keyframe every 8" not in why
    assert command == "  shmloader prepare large --out large-prepared --short-side 128 --gop 16", command
    words = hints["long"][1].split()
    ran = subprocess.run([sys.executable, "-m", *words[:2], *words[2:], "--workers", "1", "--quiet"],
                         capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    copy = probe(str(tmp_path / "long-prepared" / "v0.mp4"), check="keyframes")
    assert copy.frames == 72 and copy.keyframes is not None
    assert copy.keyframes.tolist() == list(range(0, 72, 16))
    again = subprocess.run([sys.executable, "-m", "shmloader", "scan", "long-prepared", "--out", "copies.csv",
                            "--workers", "1", "--quiet"], capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert again.returncode == 0 and "2 readable" in again.stderr, again.stderr
    assert hint_of(again.stderr) == [], again.stderr  # the copies are what the hint asked for


@pytest.mark.parametrize("args, words", [
    (("make-videos", "/proc/forbidden"), "cannot write videos in '/proc/forbidden': No such file or directory"),
    (("make-videos", "NEW", "--size", "97x127"), "size 97x127: libx264 in yuv420p takes even heights and widths"),
    (("make-videos", "NEW", "--size", "3x3"), "size 3x3: libx264 in yuv420p takes even heights and widths"),
    (("scan", "VIDEO", "--out", "VIDEO", "--quiet"), "--out 'VIDEO' is one of the inputs"),
    (("scan", "VIDEOS", "--out", "VIDEO", "--quiet"), "'VIDEO' is not a scan manifest (not text)"),
    (("scan", "VIDEOS", "--out", "EMPTY/", "--quiet"), "--out 'EMPTY/' is a folder: give the manifest's file"),
    (("scan", "EMPTY", "--out", "NEW.csv", "--quiet"), "no video found in ['EMPTY']"),
    (("prepare", "EMPTY", "--out", "NEW", "--quiet"), "no video found in ['EMPTY']"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, words):
    """Inputs argparse cannot judge: a folder that cannot be made, a size libx264 refuses, an --out
    that is a video or a folder, a folder without videos (scan wrote an empty manifest, exit 0,
    that from_csv then refused): each one line naming the file and the cause, exit 2, no traceback;
    no folder made for videos that could not be written."""
    from shmloader.samples import make_videos

    (video,), _ = make_videos(tmp_path / "videos", count=1, frames=4, size=(32, 32))
    (tmp_path / "empty").mkdir()
    names = {"VIDEOS": "videos", "VIDEO": os.path.relpath(video, tmp_path), "EMPTY": "empty", "NEW": "new"}

    def name(text: str) -> str:
        return re.sub("|".join(sorted(names, key=len, reverse=True)), lambda m: names[m[0]], text)

    out = subprocess.run([sys.executable, "-m", "shmloader", *map(name, args)], capture_output=True, text=True,
                         timeout=150, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and name(words) in lines[0] and lines[0].startswith(f"shmloader {args[0]}: "), out.stderr
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.csv").exists()
    assert os.path.getsize(video) > 1000  # the video named as --out is untouched


def test_make_videos_with_audio_writes_each_videos_tone(tmp_path):
    """`--audio` (`make_videos(audio=True)`): a sound track as long as the video, a tone of
    440 + 20 i Hz for video i, that the loader's audio fields read back."""
    import numpy as np

    import shmloader

    out = cli("make-videos", str(tmp_path / "v"), "--count", "2", "--frames", "25", "--audio")
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert all(p.endswith("_audio.mp4") for p in paths), paths
    clips = shmloader.VideoClips(paths, clip_len=25, audio_rate=16000)
    got = clips.reader().read([0, 1])
    for i in range(2):
        n = int(got["audio_len"][i])
        assert n == 16000, n  # 25 frames at 25 fps: 1 s
        spectrum = np.abs(np.fft.rfft(got["audio"][i, :n, 0]))
        assert abs(int(np.argmax(spectrum)) - (440 + 20 * i)) <= 1  # 1-Hz bins over 1 s
