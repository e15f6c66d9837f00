"""Run the CPU-dependent tests on another CPU model, emulated by qemu-user: ``make test-other-cpu``.

decord's copy-out fails at some widths depending on the row alignment FFmpeg picks for the CPU's
SIMD (32 and 96 fail with AVX-512, work with AVX2 only). The suite passes on either; this runs the
width tests as an AVX2-only CPU (``-cpu Haswell``) sees them, workers included (they start through
a wrapper that runs them under qemu too), so both sides can be checked on one machine.
Needs ``qemu-x86_64`` (Debian: ``apt-get install qemu-user``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

TESTS = ["tests/test_frames.py", "tests/test_recipes.py::test_native_width_96",
         "tests/test_realworld.py::test_pyav_equals_decord_where_decord_decodes",
         "tests/test_realworld.py::test_decord_limit_is_found_at_run_time_and_read_by_pyav",
         "tests/test_lanes.py::test_a_decoding_worker_loads_no_cuda_library"]


def main(cpu: str = "Haswell") -> int:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("qemu-x86_64 not found: apt-get install qemu-user", file=sys.stderr)
        return 2
    wrapper = os.path.join(os.path.dirname(sys.executable), f"python-{cpu.lower()}")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec {qemu} -cpu {cpu} {sys.executable} "$@"\n')
    os.chmod(wrapper, 0o755)
    code = (f"import sys; sys.executable = {wrapper!r}\n"
            "import decord, numpy, pytest\n"
            "from shmloader.video.samples import write_video\n"
            "import tempfile, os\n"
            "p = write_video(os.path.join(tempfile.mkdtemp(), 'w.mp4'), 1, frames=4)\n"
            "ok = []\n"
            "for w in (32, 96):\n"
            "    try:\n"
            "        decord.VideoReader(p, height=32, width=w).get_batch([0]); ok.append(w)\n"
            "    except decord.DECORDError:\n"
            "        pass\n"
            f"print('decord copies out widths', ok, 'on this CPU ({cpu})')\n"
            f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *{TESTS!r}]))\n")
    return subprocess.call([qemu, "-cpu", cpu, sys.executable, "-c", code])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
