"""A real local Ray cluster for the tests of ``shmloader.ray`` (one per test module: 20-30 s to
start): a head with the ``trainer`` resource and two CPU nodes with ``decode``, every node on
127.0.0.1 with a small object store; shut down with every process it started gone."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import psutil
import pytest

from .conftest import leaks, live_children, shm_entries

# Every node on 127.0.0.1 (node_ip_address below): without this, ray.init turns a loopback address
# into the machine's own IP before connecting (the switch Ray uses on macOS, read at import).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

STORE = 200 * 1024**2
NODE = {"num_cpus": 1, "object_store_memory": STORE, "include_dashboard": False, "node_ip_address": "127.0.0.1"}


def node_pids(node) -> set[int]:
    """The processes Ray started for ``node`` (raylet, gcs, log monitor...)."""
    return {info.process.pid for infos in node.all_processes.values() for info in infos}


def tree(pids: set[int]) -> set[int]:
    """``pids`` and every live descendant (a raylet's task workers)."""
    out = set(pids)
    for pid in pids:
        try:
            out |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def shm_held(pids: set[int]) -> set[str]:
    """Files under /dev/shm that processes ``pids`` hold open or mapped (Ray's object stores map
    ``/dev/shm/plasma*`` files, unlinked once mapped)."""
    out = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out |= {f.path for f in p.open_files()} | {m.path for m in p.memory_maps()}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return {f.removesuffix(" (deleted)") for f in out if f.startswith("/dev/shm/")}


@contextlib.contextmanager
def local_cluster() -> Iterator:
    """The cluster, connected (``ray.init``); ``.decode_nodes`` the two decode nodes. On exit
    every process it started is gone, and so are the object stores' files in /dev/shm."""
    import ray
    from ray.cluster_utils import Cluster

    kids_before = {p.pid for p in live_children()}
    c = Cluster(initialize_head=True, head_node_args={**NODE, "resources": {"trainer": 1}})
    try:
        c.decode_nodes = [c.add_node(**NODE, resources={"decode": 1}) for _ in range(2)]
        c.connect()
        yield c
    finally:
        started = {pid for n in [c.head_node, *c.worker_nodes] if n is not None for pid in node_pids(n)}
        started = tree(started) | {p.pid for p in live_children()} - kids_before
        held = shm_held(started)  # the object stores' files, and whatever else Ray keeps there
        ray.shutdown()
        c.shutdown()
        deadline = time.monotonic() + 30
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in started if alive(p)], "Ray processes left behind"
        assert not [p for p in live_children() if p.pid not in kids_before]
        # Compared by name, not by listing: other jobs on this machine make and remove their own.
        assert any("plasma" in f for f in held), f"the object stores' files were not seen: {held}"
        assert not [f for f in held if os.path.exists(f)], f"Ray left {held} in /dev/shm"


@contextlib.contextmanager
def no_leaks_beside(c) -> Iterator[None]:
    """conftest's check around a test, with the cluster's own processes (its nodes and their task
    workers, which Ray keeps for the next task) left to ``local_cluster``'s exit, which waits for
    them all. ``c``: the cluster, or None for a test without it."""
    before_shm = shm_entries()
    before = {p.pid for p in live_children()}
    yield
    if c is not None:
        before |= tree({pid for n in [c.head_node, *c.worker_nodes] for pid in node_pids(n)})
    found = leaks(before_shm, before)
    assert not found, "; ".join(found)


def advertise_node_type(resources: dict | None) -> None:
    """Publish in the cluster's GCS, as Ray's autoscaler does, a node type it may start with
    ``resources`` (None: take it back): what ``dataset()`` reads to tell whether a node could come."""
    from ray._raylet import GCS_AUTOSCALER_CLUSTER_CONFIG_KEY as KEY
    from ray._raylet import GCS_AUTOSCALER_STATE_NAMESPACE as NS
    from ray.core.generated import autoscaler_pb2
    from ray.experimental import internal_kv

    if resources is None:
        internal_kv._internal_kv_del(KEY.encode(), namespace=NS.encode())
        return
    config = autoscaler_pb2.ClusterConfig()
    group = config.node_group_configs.add(name="gpu_decode", min_count=0, max_count=1)
    group.resources.update(resources)
    internal_kv._internal_kv_put(KEY.encode(), config.SerializeToString(), overwrite=True, namespace=NS.encode())


# The fixtures every module with a cluster takes (``from ._ray_cluster import cluster, no_leaks``):
# one cluster a module, and conftest's leak check with the cluster's own processes left to its teardown.
@pytest.fixture(scope="module")
def cluster():
    with local_cluster() as c:
        yield c


@pytest.fixture(autouse=True)
def no_leaks(request):
    """conftest's check (``no_leaks_beside``), the cluster's own processes left to its teardown."""
    with no_leaks_beside(request.getfixturevalue("cluster") if "cluster" in request.fixturenames else None):
        yield
