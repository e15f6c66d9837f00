"""Multi-host: MultiWorkerMirroredStrategy with two worker processes on localhost.

Each process is a "host" with its own loader; together they must see every clip of an epoch
exactly once, and disjointly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(240)

HOST = textwrap.dedent("""
    import json, os, sys
    ports, task, out, paths = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": task}})
    import tensorflow as tf
    import shmloader
    from shmloader.tfdata import distributed_dataset

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    clips = shmloader.VideoClips(paths, clip_len=4, clips_per_video=2, sampling="uniform", size=(32, 40))

    def make_loader(batch_size):
        return shmloader.Loader(clips, batch_size=batch_size, workers=1, shuffle=True, seed=5, epochs=1,
                                drop_remainder=True)

    dist, loaders = distributed_dataset(strategy, make_loader, global_batch_size=4)
    seen, totals = [], []
    for batch in dist:
        for t in strategy.experimental_local_results(batch):
            seen += [[int(i), int(s)] for i, s in zip(t["index"].numpy(), t["start"].numpy())]
        total = strategy.reduce("SUM", strategy.run(lambda b: tf.reduce_sum(b["index"]), args=(batch,)), axis=None)
        totals.append(int(total))
    batch_sizes = [l.batch_size for l in loaders]
    for l in loaders:
        l.close()
    json.dump({"seen": seen, "totals": totals, "batch_sizes": batch_sizes,
               "replicas": strategy.num_replicas_in_sync}, open(out, "w"))
""")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_two_hosts_see_each_clip_once(videos, tmp_path):
    paths, _ = videos
    script = tmp_path / "host.py"
    script.write_text(HOST)
    ports = free_ports(2)
    outs = [tmp_path / f"host{i}.json" for i in range(2)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(ports), str(i), str(outs[i]),
                               json.dumps(paths)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    try:
        logs = [p.communicate(timeout=200)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    results = [json.loads(o.read_text()) for o in outs]
    a, b = ({tuple(x) for x in r["seen"]} for r in results)
    every_clip = {(v, c * (40 - 4)) for v in range(len(paths)) for c in range(2)}
    assert results[0]["replicas"] == 2 and results[0]["batch_sizes"] == [2]  # per-replica batch
    assert len(results[0]["seen"]) == len(a) == 8 and len(results[1]["seen"]) == len(b) == 8
    assert a.isdisjoint(b) and a | b == every_clip
    assert results[0]["totals"] == results[1]["totals"]  # the collective really ran across both
