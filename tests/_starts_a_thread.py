"""A module whose import starts a thread: what the fork server must never fork after
(tests/test_forkserver.py)."""

import threading

_stop = threading.Event()
threading.Thread(target=_stop.wait, daemon=True, name="started-by-import").start()
