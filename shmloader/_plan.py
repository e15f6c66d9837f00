"""The epoch plan: which sample indices an epoch visits, in which order.

Decided in the main process from ``(seed, epoch)`` alone, without opening any file, so a
source of 50 000 videos starts as fast as one of 5. Per-sample randomness (clip start,
augmentation) is seeded in the worker by ``(seed, epoch, sample)``, so neither depends on how
many workers there are or which one runs a sample.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EpochPlan", "EpochCursor"]


class EpochPlan:
    """Every host computes the same epoch order; shard ``i`` of ``n`` takes every n-th sample of
    it from position ``i``, so the shards of an epoch are disjoint and together hold all of it."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool, seed: int,
                 drop_remainder: bool, shard: tuple[int, int] = (0, 1)) -> None:
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_remainder = drop_remainder
        index, count = shard
        if not (isinstance(count, int) and count >= 1 and isinstance(index, int) and 0 <= index < count):
            raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard!r}")
        self.shard = (index, count)

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            full = np.arange(self.num_samples, dtype=np.int64)
        else:
            full = np.random.default_rng((self.seed, epoch)).permutation(self.num_samples).astype(np.int64)
        index, count = self.shard
        return full[index::count]

    def samples_per_epoch(self) -> int:
        index, count = self.shard
        return len(range(index, self.num_samples, count))

    def batches_per_epoch(self) -> int:
        n, b = self.samples_per_epoch(), self.batch_size
        return n // b if self.drop_remainder else -(-n // b)


class EpochCursor:
    """Hands out one epoch's samples: whole batches first, then single samples to refill skips.

    With ``drop_remainder`` the last ``n % batch_size`` samples form no batch of their own but
    still refill batches whose samples were skipped, so a skip costs no other sample.
    """

    def __init__(self, plan: EpochPlan, epoch: int) -> None:
        self.epoch = epoch
        self.order = plan.order(epoch)
        self.batch_size = plan.batch_size
        n = len(self.order)
        self.limit = n - n % plan.batch_size if plan.drop_remainder else n
        self.pos = 0  # next sample for a new batch
        self.tail = self.limit  # next sample of the dropped remainder

    def has_batch(self) -> bool:
        return self.pos < self.limit

    def next_batch(self) -> list[int]:
        end = min(self.pos + self.batch_size, self.limit)
        samples = self.order[self.pos : end].tolist()
        self.pos = end
        return samples

    def refill(self) -> int | None:
        if self.pos < self.limit:
            self.pos += 1
            return int(self.order[self.pos - 1])
        if self.tail < len(self.order):
            self.tail += 1
            return int(self.order[self.tail - 1])
        return None
