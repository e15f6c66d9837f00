"""The first draws of ``numpy.random.default_rng(seed)`` for many seeds at once, bit for bit.

The bucket search of an epoch draws from ``default_rng(seed + epoch + row × buckets)`` for every
video, so a video's bucket is the same wherever it is computed; a loop that builds one generator a
video costs about 10 µs each, seconds for a million videos. Here the same numbers come from numpy's
own algorithms run over arrays of seeds: ``SeedSequence(entropy=seed)`` (numpy
``random/bit_generator.pyx``), its ``generate_state(4, uint64)`` seeding ``PCG64``
(``random/src/pcg64``), and ``Generator.random()`` (``(next64 >> 11) / 2**53``).

The 128-bit state is a pair of uint64 arrays ``(hi, lo)``; numpy's uint64 and uint32 array
arithmetic wraps, which is the arithmetic the C code relies on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["first_draws"]

# SeedSequence's hash constants (numpy random/bit_generator.pyx), all uint32 arithmetic.
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = np.uint32(0xCA01F9DD)
_MIX_MULT_R = np.uint32(0x4973F715)
_XSHIFT = 16
_POOL_SIZE = 4  # SeedSequence's default pool: a 64-bit seed's two words never overflow it
_WORD = 0xFFFFFFFF

# PCG64's LCG multiplier (PCG_DEFAULT_MULTIPLIER_128), as 64-bit halves and their 32-bit limbs.
_MULT_HI = np.uint64(2549297995355413924)
_MULT_LO = np.uint64(4865540595714422341)
_MULT_LO_LIMBS = (np.uint64(4865540595714422341 & _WORD), np.uint64(4865540595714422341 >> 32))
_LOW32 = np.uint64(_WORD)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53: a double from the top 53 bits

_U128 = tuple[np.ndarray, np.ndarray]  # (high, low) uint64 halves of 128-bit numbers


def first_draws(seeds: np.ndarray, count: int) -> np.ndarray:
    """[len(seeds), count] float64: bit for bit np.random.default_rng(int(s)).random(count) for each s.

    ``seeds``: non-negative integers below 2**64, an array of any integer dtype or a list of ints.
    """
    seeds = _as_seeds(seeds)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    state, inc = _pcg64_seeded(_seed_sequence_state(seeds))
    out = np.empty((len(seeds), count), dtype=np.float64)
    for k in range(count):
        state = _step(state, inc)
        out[:, k] = (_xsl_rr(state) >> np.uint64(11)) * _TO_UNIT
    return out


def _as_seeds(seeds: Any) -> np.ndarray:
    """The seeds as a 1-D uint64 array; a negative, too large or non-integer seed raises."""
    arr = np.asarray(seeds)
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if not isinstance(seeds, np.ndarray) and arr.dtype.kind in "fO":
        # A list holding ints past int64 becomes float64 (lossy) or object: take the ints themselves.
        items = np.asarray(seeds, dtype=object).reshape(-1)
        if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in items):
            raise TypeError("seeds must be integers")
        if not all(0 <= s < 2**64 for s in items):
            raise ValueError("seeds must be non-negative and below 2**64")
        return np.array([int(s) for s in items], dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"seeds must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and arr.min() < 0:
        raise ValueError("seeds must be non-negative and below 2**64")
    return arr.astype(np.uint64).reshape(-1)


def _hashmix(value: np.ndarray, hash_const: int) -> tuple[np.ndarray, int]:
    """SeedSequence's ``hashmix``: the mixed value and the next hash constant."""
    value = value ^ np.uint32(hash_const)
    hash_const = (hash_const * _MULT_A) & _WORD
    value = value * np.uint32(hash_const)
    return value ^ (value >> np.uint32(_XSHIFT)), hash_const


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result: np.ndarray = _MIX_MULT_L * x - _MIX_MULT_R * y
    mixed: np.ndarray = result ^ (result >> np.uint32(_XSHIFT))
    return mixed


def _seed_sequence_state(seeds: np.ndarray) -> list[np.ndarray]:
    """``SeedSequence(entropy=s).generate_state(4, np.uint64)`` as four uint64 arrays.

    The entropy is the seed's uint32 words, least significant first, at least one: a seed below
    2**32 gives one word, where a second word of zero would have given the same pool, because the
    pool's missing words are hashed as zeros. With at most four words, only the pool's own rounds
    run (no further entropy words are folded in afterwards).
    """
    words = [(seeds & _LOW32).astype(np.uint32), (seeds >> np.uint64(32)).astype(np.uint32)]
    words += [np.zeros(len(seeds), dtype=np.uint32)] * (_POOL_SIZE - len(words))
    hash_const = _INIT_A
    pool = []
    for word in words:
        mixed, hash_const = _hashmix(word, hash_const)
        pool.append(mixed)
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                hashed, hash_const = _hashmix(pool[src], hash_const)
                pool[dst] = _mix(pool[dst], hashed)
    # generate_state: eight uint32 words cycling over the pool, paired little-endian into uint64s.
    hash_const = _INIT_B
    out32 = []
    for i in range(2 * _POOL_SIZE):
        value = pool[i % _POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_B) & _WORD
        value = value * np.uint32(hash_const)
        out32.append(value ^ (value >> np.uint32(_XSHIFT)))
    return [out32[2 * i].astype(np.uint64) | (out32[2 * i + 1].astype(np.uint64) << np.uint64(32))
            for i in range(_POOL_SIZE)]


def _pcg64_seeded(words: list[np.ndarray]) -> tuple[_U128, _U128]:
    """``pcg64_set_seed(seed=words[0:2], inc=words[2:4])``: words 0 and 2 are the high halves.

    pcg_setseq_128_srandom_r: state = 0, inc = initseq << 1 | 1, step, state += initstate, step.
    """
    seed_hi, seed_lo, seq_hi, seq_lo = words
    inc = ((seq_hi << np.uint64(1)) | (seq_lo >> np.uint64(63)), (seq_lo << np.uint64(1)) | np.uint64(1))
    state = inc  # the first step from state 0 leaves just the increment
    state = _add(state, (seed_hi, seed_lo))
    return _step(state, inc), inc


def _add(a: _U128, b: _U128) -> _U128:
    """128-bit addition mod 2**128."""
    lo = a[1] + b[1]
    return a[0] + b[0] + (lo < a[1]).astype(np.uint64), lo


def _step(state: _U128, inc: _U128) -> _U128:
    """One LCG step, state × multiplier + inc mod 2**128.

    The low halves' full 128-bit product comes from 32-bit limbs; the cross terms only reach the
    high half, where uint64's wrapping is the mod 2**128 wanted.
    """
    hi, lo = state
    lo0, lo1 = lo & _LOW32, lo >> np.uint64(32)
    m0, m1 = _MULT_LO_LIMBS
    p00, p01, p10 = lo0 * m0, lo0 * m1, lo1 * m0
    mid = (p00 >> np.uint64(32)) + (p01 & _LOW32) + (p10 & _LOW32)  # < 3 × 2**32: no overflow
    prod_hi = lo1 * m1 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (mid >> np.uint64(32))
    prod_hi = prod_hi + hi * _MULT_LO + lo * _MULT_HI
    return _add((prod_hi, lo * _MULT_LO), inc)


def _xsl_rr(state: _U128) -> np.ndarray:
    """PCG's XSL-RR output of the (already stepped) state: (hi ^ lo) rotated right by hi >> 58."""
    hi, lo = state
    x = hi ^ lo
    rot = hi >> np.uint64(58)
    out: np.ndarray = (x >> rot) | (x << ((np.uint64(64) - rot) & np.uint64(63)))
    return out
