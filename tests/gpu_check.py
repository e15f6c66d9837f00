"""The adapters' accelerator paths, on a machine with CUDA (not part of ``make test``).

    PYTHONPATH=. python tests/gpu_check.py

torch: ``as_torch(pin_memory=True, device="cuda")`` must copy from page-locked host buffers with
``non_blocking`` copies, and a host buffer must not be reused while its copy is in flight: every
batch is checked on the GPU against the pattern its sample index defines, with no host
synchronisation between batches (a buffer overwritten too early would show as mismatches), while
the device tensors of many batches are kept alive. JAX: ``shmloader.jax.batches`` onto the GPU,
with its prefetch. Prints one JSON line: checks, mismatches, and the rates seen.
"""

from __future__ import annotations

import json
import time

import numpy as np

import shmloader

SHAPE = (8, 112, 112, 3)  # one sample: 301 KiB
BATCH = 32
SAMPLES = 32 * 60


def sample(i, rng):
    x = (np.arange(np.prod(SHAPE), dtype=np.int64).reshape(SHAPE) + 7 * i) % 251
    return {"x": x.astype(np.uint8), "i": np.int64(i)}


def loader(**kw):
    source = shmloader.FunctionSource(sample, {"x": (SHAPE, np.uint8), "i": ((), np.int64)}, SAMPLES)
    return shmloader.Loader(source, batch_size=BATCH, workers=4, shuffle=True, seed=1, **kw)


def unprotected(batches):
    """The same adapter with the NOTE's rule broken: the host batch is dropped as soon as its
    non-blocking copy is queued. Shows that the check below can see a buffer reused too early."""
    import torch

    def to_device(host):
        return {k: v.to("cuda", non_blocking=True) for k, v in host.items()}

    batches._to_device = to_device
    return batches


def torch_checks() -> dict:
    import torch

    ramp = torch.arange(int(np.prod(SHAPE)), device="cuda", dtype=torch.int64).reshape(SHAPE)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    for pin, rule in ((True, True), (False, True), (True, False)):
        with loader(epochs=2) as ld:
            batches = ld.as_torch(pin_memory=pin, device="cuda")
            if not rule:
                batches = unprotected(batches)
            bad = torch.zeros((), device="cuda", dtype=torch.int64)
            kept, n, pinned, t0 = [], 0, set(), time.perf_counter()
            for b in batches:
                assert b["x"].is_cuda and b["i"].is_cuda
                if batches._inflight:
                    pinned.add(bool(batches._inflight[-1][1]["x"].is_pinned()))
                expect = (ramp[None] + 7 * b["i"][:, None, None, None, None]) % 251
                bad += (b["x"].to(torch.int64) != expect).sum()  # no sync: checked at the end
                torch.cuda._sleep(100_000_000)  # a busy stream: the next copies wait behind it
                if n % 10 == 0:
                    kept.append(b)  # device tensors kept alive across many batches
                n += 1
                if n == 5:
                    t0, n0 = time.perf_counter(), n
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            for b in kept:  # kept batches still hold what they arrived with
                expect = (ramp[None] + 7 * b["i"][:, None, None, None, None]) % 251
                bad += (b["x"].to(torch.int64) != expect).sum()
            out[f"pin_{pin}" + ("" if rule else "_unprotected")] = {"batches": n, "mismatches": int(bad), "host_pinned": sorted(pinned),
                                 "gb_per_s": round((n - n0) * BATCH * int(np.prod(SHAPE)) / dt / 1e9, 2),
                                 "ring_copied": ld.stats()["copied"]}
            batches.close()
    return out


def jax_checks() -> dict:
    import jax
    import jax.numpy as jnp

    import shmloader.jax

    ramp = jnp.arange(int(np.prod(SHAPE)), dtype=jnp.int32).reshape(SHAPE)
    out = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}
    with loader(epochs=2) as ld:
        bad, n, platforms = 0, 0, set()
        for b in shmloader.jax.batches(ld):
            platforms |= {d.platform for d in b["x"].devices()}
            expect = (ramp[None] + 7 * b["i"].astype(jnp.int32)[:, None, None, None, None]) % 251
            bad = bad + (b["x"].astype(jnp.int32) != expect).sum()
            n += 1
        out["batches"], out["mismatches"], out["platforms"] = n, int(bad), sorted(platforms)
    return out


def main() -> None:
    result = {}
    for name, check in (("torch", torch_checks), ("jax", jax_checks)):
        try:
            result[name] = check()
        except Exception as e:  # report and go on to the other framework
            result[name] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
