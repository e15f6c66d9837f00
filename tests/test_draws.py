"""shmloader.opensora.draws: the first draws of ``numpy.random.default_rng(seed)`` for an array of
seeds, checked bit for bit against numpy's own generator over seeds at every word boundary, large
seeds and random ones, and the errors numpy raises for seeds it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from shmloader.opensora.draws import first_draws

pytestmark = pytest.mark.timeout(60)

# Seeds where the entropy's uint32 words change: zero, one word, two words, the top of the range.
EDGES = [0, 1, 2, 3, 7, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1,
         2**33, 2**48 + 12345, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1]


def reference(seeds, count: int) -> np.ndarray:
    return np.array([np.random.default_rng(int(s)).random(count) for s in seeds]).reshape(len(seeds), count)


def seeds_spanning() -> np.ndarray:
    """A few thousand seeds: the edges, a run of small ones, runs past 2**32, random up to 2**62."""
    rng = np.random.default_rng(20240601)
    parts = [EDGES, range(1000), range(2**32 - 200, 2**32 + 200),
             rng.integers(0, 2**32, 500, dtype=np.uint64), rng.integers(0, 2**62, 1500, dtype=np.uint64),
             (rng.integers(0, 1000, 300, dtype=np.uint64) + np.uint64(2**62 - 1000))]
    return np.concatenate([np.asarray(list(p) if isinstance(p, range) else p, dtype=np.uint64) for p in parts])


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_matches_default_rng_bit_for_bit(count):
    seeds = seeds_spanning()
    got = first_draws(seeds, count)
    assert got.shape == (len(seeds), count) and got.dtype == np.float64
    assert np.array_equal(got, reference(seeds, count))


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32])
def test_integer_dtypes_agree(dtype):
    seeds = np.array([0, 1, 12345, 2**31 - 1], dtype=dtype)
    assert np.array_equal(first_draws(seeds, 3), reference(seeds, 3))


def test_python_ints_past_int64():
    seeds = [2**63, 2**64 - 1, 5]
    assert np.array_equal(first_draws(seeds, 2), reference(seeds, 2))


def test_seed_plus_epoch_plus_row_times_buckets():
    """The bucket search's seeds: seed + epoch + row × buckets, as int64."""
    rows = np.arange(5000, dtype=np.int64)
    seeds = 42 + 3 + rows * 17
    assert np.array_equal(first_draws(seeds, 3), reference(seeds, 3))


def test_no_seeds_or_no_draws():
    assert first_draws(np.array([], dtype=np.int64), 3).shape == (0, 3)
    assert first_draws(np.array([1, 2]), 0).shape == (2, 0)


def test_negative_seed_raises():
    with pytest.raises(ValueError, match="non-negative"):
        first_draws(np.array([3, -1]), 1)


def test_float_seeds_raise():
    with pytest.raises(TypeError, match="integers"):
        first_draws(np.array([1.5]), 1)


def test_seed_past_64_bits_raises():
    with pytest.raises(ValueError, match="2\\*\\*64"):
        first_draws([1, 2**64], 1)
