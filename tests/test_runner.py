"""The runner of per-file work (``tools.runner``) on its own, in real worker processes: answers in
input order, a bounded window, a crash or a timeout tried once more alone with twice the time
and then a failure that says which, items of one key sharing a try, and a stop that leaves no
worker behind."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from shmloader.tools.runner import Failure, Outcome, ProcessBackend, Ready, Work, run

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def forkserver():
    """The fork server the pools start their workers from, started before each test's leak check
    counts this process's children, and stopped after the module."""
    multiprocessing.forkserver.ensure_running()
    yield
    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


def note(folder: str, x: int) -> None:
    """Record one try of item ``x`` (its process's pid) in ``folder``."""
    with open(os.path.join(folder, f"{x}.{os.getpid()}.{time.monotonic_ns()}"), "w"):
        pass


def tries(folder: str, x: int) -> int:
    return sum(1 for name in os.listdir(folder) if name.split(".")[0] == str(x))


def square(folder: str, x: int, late: float = 0.0) -> int:
    note(folder, x)
    time.sleep(late)
    return x * x


def crash_on(folder: str, x: int, bad: int) -> int:
    """``x * x``; the process dies at once on ``bad`` (a decoder's segfault)."""
    note(folder, x)
    if x == bad:
        os._exit(1)
    return x * x


def crash_once(folder: str, x: int) -> int:
    """``x * x``, once its first try has died."""
    first = not tries(folder, x)
    note(folder, x)
    if first:
        os._exit(1)
    return x * x


def meet(folder: str, x: int, other: int, die: bool) -> int:
    """Once ``other`` has started too (or after 10 s): die at once, or answer ``x * x`` a second later."""
    note(folder, x)
    deadline = time.monotonic() + 10
    while not tries(folder, other) and time.monotonic() < deadline:
        time.sleep(0.01)
    if die:
        os._exit(1)
    time.sleep(1)
    return x * x


def hang_on(folder: str, x: int, bad: int) -> int:
    """``x * x``; ``bad`` never ends."""
    note(folder, x)
    if x == bad:
        time.sleep(3600)
    return x * x


def slow_once(folder: str, x: int, seconds: float) -> int:
    """``x * x``; the first try takes ``seconds`` (a busy machine), the second none."""
    first = not tries(folder, x)
    note(folder, x)
    if first:
        time.sleep(seconds)
    return x * x


def values(outcomes: list[Outcome]) -> list:
    return [o.value if o.failure is None else o.failure for o in outcomes]


def test_answers_come_in_input_order_whichever_finishes_first(tmp_path):
    """The first item answers last (it takes a moment); every answer is still given back in its
    item's place, with the item's meta, a Ready in its place too."""
    items = [Work(square, (str(tmp_path), 0, 0.5), meta="m0")]
    items += [Work(square, (str(tmp_path), x), meta=f"m{x}") for x in range(1, 6)]
    items.insert(3, Ready("earlier", meta="kept"))
    got = list(run(items, ProcessBackend(2, 2), timeout=30))
    assert [o.meta for o in got] == ["m0", "m1", "m2", "kept", "m3", "m4", "m5"]
    assert values(got) == [0, 1, 4, "earlier", 9, 16, 25]


def test_the_window_bounds_the_items_taken_ahead(tmp_path):
    """Items are taken lazily: no more than the backend's window are waiting at once."""
    taken = []

    def items():
        for x in range(12):
            taken.append(x)
            yield Work(square, (str(tmp_path), x))

    outcomes = run(items(), ProcessBackend(1, 3), timeout=30)
    first = next(outcomes)
    assert first.value == 0 and len(taken) <= 4, taken  # the window of 3, and the one given back
    assert values(list(outcomes)) == [x * x for x in range(1, 12)]


def test_a_crash_is_tried_once_more_alone_then_fails(tmp_path):
    """A process that dies breaks the pool: the files beside it are done again as if nothing
    happened, the file that crashes is tried once more alone and then fails as a crash."""
    folder = str(tmp_path)
    got = list(run([Work(crash_on, (folder, x, 2)) for x in range(6)], ProcessBackend(2, 2), timeout=30))
    assert values(got[:2] + got[3:]) == [0, 1, 9, 16, 25]
    assert got[2].failure == Failure("crash", detail="its process died", tries=2)
    assert tries(folder, 2) >= 2


def test_a_file_lost_with_anothers_crash_is_not_blamed(tmp_path):
    """The first file is still running when the second one's process dies and breaks the pool
    (each waits until the other has started): the first is lost with it and answers when done
    again alone; the second, sent again with the files lost beside it, fails alone too."""
    folder = str(tmp_path)
    items = [Work(meet, (folder, 0, 1, False)), Work(meet, (folder, 1, 0, True)), Work(square, (folder, 2))]
    got = list(run(items, ProcessBackend(2, 1), timeout=30))
    assert values(got) == [0, Failure("crash", detail="its process died", tries=2), 4]
    # Mostly the first is lost with the pool (done twice) and the second runs in the pool, is sent
    # again with it, then alone (three times); on a busy machine the first's try may answer before
    # the pool is seen broken (once, its answer kept) and the second then runs twice.
    assert (tries(folder, 0), tries(folder, 1)) in ((2, 3), (1, 2))


def test_a_crash_that_does_not_come_back_alone_is_an_answer(tmp_path):
    got = list(run([Work(crash_once, (str(tmp_path), x)) for x in range(3)], ProcessBackend(1, 1), timeout=30))
    assert values(got) == [0, 1, 4]


def test_a_timeout_is_tried_once_more_with_twice_the_time_then_fails(tmp_path):
    """A file that never ends: over its deadline (from when it is the oldest in flight), again
    alone over twice that, then a timeout failure naming the retry's time; the rest answer."""
    folder = str(tmp_path)
    t0 = time.monotonic()
    # 3 s: the others' tries (instant) answer within it even on a machine busy with a whole suite
    got = list(run([Work(hang_on, (folder, x, 1)) for x in range(4)], ProcessBackend(2, 2), timeout=3))
    assert got[1].failure == Failure("timeout", seconds=6.0, tries=2)
    assert values(got[:1] + got[2:]) == [0, 4, 9] and tries(folder, 1) == 2
    assert time.monotonic() - t0 < 60


def test_a_try_slow_once_answers_on_its_retry(tmp_path):
    # 3 s, retried with 6: a fresh process's answer comes within it on a machine busy with a whole suite
    got = list(run([Work(slow_once, (str(tmp_path), x, 30.0)) for x in range(2)], ProcessBackend(1, 2), timeout=3))
    assert values(got) == [0, 1]


def test_items_of_one_key_share_one_try_and_its_failure(tmp_path):
    """A file listed again (a video's spans) is tried once for all its items, and a file that
    failed is not tried again for its later items (one item in flight: the tries are counted
    exactly, none lost with a pool another file broke)."""
    folder = str(tmp_path)
    items = [Work(square, (folder, x), key=str(x), meta=i) for i, x in enumerate([3, 3, 4, 3])]
    assert values(list(run(items, ProcessBackend(2, 2), timeout=30, reuse=8))) == [9, 9, 16, 9]
    assert tries(folder, 3) == 1 and tries(folder, 4) == 1
    items = [Work(crash_on, (folder, x, 7), key=str(x), meta=i) for i, x in enumerate([7, 5, 7])]
    got = list(run(items, ProcessBackend(1, 1), timeout=30, reuse=8))
    assert got[0].failure == got[2].failure == Failure("crash", detail="its process died", tries=2)
    assert got[1].value == 25 and tries(folder, 7) == 2


def test_closing_the_run_early_ends_its_workers(tmp_path):
    """A caller that stops reading (an error in its loop): the tries in flight are ended."""
    outcomes = run([Work(hang_on, (str(tmp_path), x, 1)) for x in range(4)], ProcessBackend(2, 2), timeout=60)
    assert next(outcomes).value == 0
    workers = [p for p in psutil.Process().children(recursive=True) if p.ppid() != os.getpid()]
    assert workers  # the fork server's children
    outcomes.close()
    assert not psutil.wait_procs(workers, timeout=10)[1]


STOPPED = textwrap.dedent("""
    import sys
    from shmloader.tools.runner import ProcessBackend, Work, run
    from tests.test_runner import hang_on

    try:
        for outcome in run([Work(hang_on, (sys.argv[1], x, -1 if x < 2 else x)) for x in range(6)],
                           ProcessBackend(2, 2), timeout=60):
            print(outcome.value, flush=True)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        sys.exit(130)
""")


def test_ctrl_c_ends_every_worker_once(tmp_path):
    """Ctrl-C to the process group (a terminal's): the workers ignore it, the main process ends
    them all and stops with one KeyboardInterrupt; no worker prints a traceback."""
    p = subprocess.Popen([sys.executable, "-c", STOPPED, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    deadline = time.monotonic() + 30
    while tries(str(tmp_path), 2) + tries(str(tmp_path), 3) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    kids = psutil.Process(p.pid).children(recursive=True)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and err.strip() == "stopped", err
    assert out.split() == ["0", "1"]
    assert not psutil.wait_procs(kids, timeout=10)[1]


def test_a_stop_hands_back_the_answers_not_given_yet(tmp_path):
    """The caller stops reading (a Ctrl-C in its loop) while later items have answered already:
    their outcomes go to ``answered``, in order, so that what their tries made is listed (prepare
    writes their rows); a try still running is ended, not waited for."""
    folder = str(tmp_path)
    backend = ProcessBackend(2, 4)
    late: list[Outcome] = []
    items = [Work(square, (folder, 0), meta=0), Work(square, (folder, 1, 0.2), meta=1),
             Work(square, (folder, 2, 30.0), meta=2)]
    outcomes = run(items, backend, timeout=None, answered=late)
    assert next(outcomes).value == 0
    deadline = time.monotonic() + 20
    while tries(folder, 2) == 0 and time.monotonic() < deadline:  # item 1 answered, item 2 running
        time.sleep(0.02)
    time.sleep(0.5)
    outcomes.close()
    assert [(o.meta, o.value) for o in late] == [(1, 1)]
