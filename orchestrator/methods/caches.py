"""The class caches that TDA and the methods built on it (DPE, BoostAdapter) keep: TDA's per-class cache of one
stream (`ClassCache`) and H such caches stepped together in lockstep (`LockstepCaches`)."""

from __future__ import annotations

import bisect
import math

import torch

from orchestrator.methods.numerics import product


class ClassCache:
    """TDA's per-class cache: `shot` entries per class, each slot ranked by entropy (lowest first).

    keys [K, shot, d], entropy [K, shot] (inf where empty) and values [K, shot, K] hold the entries by class and
    slot. The per-sample products read compact copies instead (row r: the r-th slot ever filled; a slot keeps its
    row when its entry is replaced), so they run over the filled entries only, as the public code's per-class
    lists do, not over the whole K * shot capacity.
    """

    def __init__(self, num_classes: int, shot: int, dim: int, device: torch.device, with_values: bool,
                 dtype: torch.dtype = torch.float32) -> None:
        self.shot = shot
        self.keys = torch.zeros(num_classes, shot, dim, dtype=dtype, device=device)
        self.entropy = torch.full((num_classes, shot), math.inf, dtype=torch.float32, device=device)
        self.values = (torch.zeros(num_classes, shot, num_classes, dtype=dtype, device=device)
                       if with_values else None)
        self.filled = 0
        self.rows = torch.zeros(num_classes * shot, dim, dtype=dtype, device=device)
        self.row_classes = torch.zeros(num_classes * shot, dtype=torch.int64, device=device)
        self.row_values = (torch.zeros(num_classes * shot, num_classes, dtype=dtype, device=device)
                           if with_values else None)
        # Per class, the entries' (loss, slot, row) in rank order; entries never move.
        self.ranking: list[list[tuple[float, int, int]]] = [[] for _ in range(num_classes)]

    def offer(self, k: int, key: torch.Tensor, loss: float, value: torch.Tensor | None = None) -> bool:
        """TDA's update_cache: append while there is room, else replace the worst if strictly better."""
        ranking = self.ranking[k]
        if len(ranking) < self.shot:
            slot, row = len(ranking), self.new_row(k)
        elif loss < ranking[-1][0]:
            _, slot, row = ranking.pop()
        else:
            return False
        # Stable re-sort: the new entry goes after every entry with an equal loss.
        ranking.insert(bisect.bisect_right([entry[0] for entry in ranking], loss), (loss, slot, row))
        self.store(k, slot, row, key, loss, value)
        return True

    def new_row(self, k: int) -> int:
        """The compact row of a slot of class k filled for the first time."""
        row = self.filled
        self.row_classes[row] = k
        self.filled += 1
        return row

    def store(self, k: int, slot: int, row: int, key: torch.Tensor, loss: float, value: torch.Tensor | None) -> None:
        """Write an entry into slot `slot` of class k and its compact row (the ranking is the caller's)."""
        self.keys[k, slot] = key
        self.rows[row] = key
        self.entropy[k, slot] = loss
        if self.values is not None:
            self.values[k, slot] = value
            self.row_values[row] = value

    def weights(self, f: torch.Tensor, beta: float) -> torch.Tensor:
        """exp(-beta * (1 - f . key)) of each filled entry, by compact row [filled]."""
        return torch.exp(-1.0 * (beta - beta * product(self.rows[:self.filled], f)))

    def class_sums(self, f: torch.Tensor, beta: float) -> torch.Tensor:
        """[K] the weights summed per class: the positive cache's product with one-hot class values (summed in
        float32 and rounded once, as a float16 product accumulates)."""
        sums = torch.zeros(self.entropy.shape[0], dtype=torch.float32, device=f.device)
        weights = self.weights(f, beta)
        return sums.index_add_(0, self.row_classes[:self.filled], weights.float()).to(weights.dtype)

    def value_sums(self, f: torch.Tensor, beta: float) -> torch.Tensor:
        """[K] the weights times the entries' values: the negative cache's product with its masks."""
        return product(self.weights(f, beta), self.row_values[:self.filled])

    def state(self, prefix: str) -> dict[str, torch.Tensor]:
        """The state tensors in float32 (a float16 cache's values exactly)."""
        out = {f"{prefix}_keys": self.keys.to(torch.float32, copy=True), f"{prefix}_entropy": self.entropy.clone()}
        if self.values is not None:
            out[f"{prefix}_values"] = self.values.to(torch.float32, copy=True)
        return out


# The view path's [chunk, V, M] logits are streamed through half a dozen elementwise passes: on a CPU a
# chunk that stays in cache (1M floats: 16 samples of 64 views at M = 1000) beats one large product
# (benchmarks.methods, TDA's official column); a GPU wants large chunks.


class LockstepCaches:
    """H TDA caches of `shot[h]` (>= 1) entries per class, stepped together. A `fifo` cache
    (BoostAdapter's negative one) replaces a full class's oldest entry instead of its worst. Losses are kept in
    `loss_dtype`: float64 where the single-stream cache ranks Python floats that are not float32 values (DPE's
    entropy / log2 K); the state reports them in float32, as `ClassCache.entropy` stores them."""

    def __init__(self, shots: list[int], num_classes: int, dim: int, device: torch.device, with_values: bool,
                 fifo: bool = False, loss_dtype: torch.dtype = torch.float32):
        H, K = len(shots), num_classes
        S = max(shots)
        P = K * S  # pool rows; row P is a dump that non-entering writes go to
        self.K, self.S, self.P = K, S, P
        self.rows = torch.arange(H, device=device)
        self.shot = torch.tensor(shots, dtype=torch.int64, device=device)
        self.slot_loss = torch.full((H, K, S), math.inf, dtype=loss_dtype, device=device)
        self.slot_time = torch.zeros(H, K, S, dtype=torch.int64, device=device)
        self.slot_pool = torch.zeros(H, K, S, dtype=torch.int64, device=device)
        self.count = torch.zeros(H, K, dtype=torch.int64, device=device)
        self.used = torch.zeros(H, dtype=torch.int64, device=device)
        self.keys = torch.zeros(H, P + 1, dim, dtype=torch.float32, device=device)
        self.cls = torch.full((H, P + 1), K, dtype=torch.int64, device=device)  # K: empty (a dropped column)
        self.values = (torch.zeros(H, P + 1, K, dtype=torch.float32, device=device) if with_values else None)
        self.slots = torch.arange(S, device=device)
        self.fifo = fifo

    def offer(self, step: int, gate: torch.Tensor, pred: torch.Tensor, loss: torch.Tensor, f: torch.Tensor,
              value: torch.Tensor | None = None) -> torch.Tensor:
        """TDA's update_cache in every cache at once: append while class `pred` has room, else replace its worst
        entry (highest loss; among equal losses the newest) when `loss` is strictly lower, or in a fifo cache
        its oldest entry, always. f (and value) are one row for all caches or one per cache. [H] bool: entered."""
        rows = self.rows
        count = self.count[rows, pred]
        row_loss = self.slot_loss[rows, pred]
        row_time = self.slot_time[rows, pred]
        filled = self.slots[None, :] < count[:, None]
        room = count < self.shot
        if self.fifo:
            enter = gate
            victim = torch.where(filled, row_time, torch.iinfo(torch.int64).max).argmin(dim=1)
        else:
            ranked = torch.where(filled, row_loss, -math.inf)
            worst = ranked.max(dim=1).values
            victim = torch.where(ranked == worst[:, None], row_time, -1).argmax(dim=1)
            enter = gate & (room | (loss < worst))
        slot = torch.where(room, count, victim)
        old_pool = self.slot_pool[rows, pred, slot]
        pool = torch.where(enter, torch.where(room, self.used, old_pool), self.P)
        self.keys[rows, pool] = f
        self.cls[rows, pool] = torch.where(enter, pred, self.K)
        if value is not None:
            self.values[rows, pool] = value
        self.slot_loss[rows, pred, slot] = torch.where(enter, loss, row_loss[rows, slot])
        self.slot_time[rows, pred, slot] = torch.where(enter, step, row_time[rows, slot])
        self.slot_pool[rows, pred, slot] = torch.where(enter, pool, old_pool)
        grew = (enter & room).long()
        self.count[rows, pred] += grew
        self.used += grew
        return enter

    def weights(self, f: torch.Tensor, beta: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """exp(-beta (1 - f . key)) per stream over the longest filled pool prefix [G, used], for one query
        f [d] or one per cache [H, d]. A cache with fewer rows leaves the rest as they started, class K (a
        dropped column) and zero values, so their weights add nothing."""
        used = int(self.used.max())
        keys = self.keys[:, :used]
        affinity = keys @ f if f.ndim == 1 else torch.bmm(keys, f[:, :, None])[..., 0]
        return torch.exp(-1.0 * (beta - beta * affinity[group]))

    def class_sums(self, weights: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """[G, K + 1] each stream's weights [G, used] summed per class (column K: the unfilled rows'), as a
        positive cache's product with its one-hot values."""
        sums = torch.zeros(weights.shape[0], self.K + 1, dtype=torch.float32, device=weights.device)
        return sums.scatter_add_(1, self.cls[group, :weights.shape[1]], weights)

    def value_sums(self, weights: torch.Tensor, members: list[torch.Tensor]) -> torch.Tensor:
        """[G, K] each stream's weights [G, used] times its cache's values (members[h]: the streams of cache h),
        as a negative cache's product with its masks."""
        used = weights.shape[1]
        out = torch.empty(weights.shape[0], self.K, dtype=torch.float32, device=weights.device)
        for h, rows in enumerate(members):
            out[rows] = weights[rows] @ self.values[h, :used]
        return out

    def state(self, h: int, shot: int, prefix: str) -> dict[str, torch.Tensor]:
        """Cache h in TDA's layout ([K, shot, ...], zeros and inf where empty), as `ClassCache.state` gives it."""
        filled = (self.slots[None, :shot] < self.count[h, :, None])
        pool = torch.where(filled, self.slot_pool[h, :, :shot], self.P)
        out = {f"{prefix}_keys": torch.where(filled[..., None], self.keys[h, pool], 0.0),
               f"{prefix}_entropy": self.slot_loss[h, :, :shot].to(torch.float32, copy=True)}
        if self.values is not None:
            out[f"{prefix}_values"] = torch.where(filled[..., None], self.values[h, pool], 0.0)
        return out
