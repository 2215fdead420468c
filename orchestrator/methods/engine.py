"""Exact blocked engine for the BCA family (clip, la, pa, bca): the semantics of
`orchestrator.methods.reference.bca_family_reference`, at matrix-product speed.

Why blocks: the per-sample loop does two matrix-vector products per sample (logits U f, posterior p V)
plus a dozen small tensor ops, and on a CPU the small ops cost more than the products. Here a block of B
samples gets its logits from ONE product against the block-start state, Z0 = logit_scale * F_B U^T, and its
unnormalised posteriors from ONE product Q0 = exp(Z0 - shift) V. A compiled walk (numba) then visits the
block's samples in stream order and corrects both for exactly the rows of U and V that changed since
the state the products came from (the block's start; with more threads, see below, the previous block's):

    z_j[r]  = logit_scale * U_now[r] . f_j                       for rows r whose U row changed since
    S_j     = S0_j - sum_r E0[j, r] + sum_r exp(z_j[r] - shift_j)     (softmax normaliser, float64)
    q_j     = Q0_j + sum_r (e_j[r] V_now[r] - E0[j, r] V_base[r])     for rows changed in U or V
    post_j  = q_j / sum(q_j)                                     (the reference renormalises post too)

so every sample sees the state as it is at its own position, never a stale one. Selection,
gates, counters and the row updates follow the reference operation by operation (see `_walk`).

Numerics. exp uses a per-sample shift (the block-start row max) so nothing overflows; S_j is accumulated
in float64 from the same float32 E0 values that it later subtracts, so removing a row is exact. Q0 is a
float32 product, so its absolute error is ~1e-7 * S0_j; if corrections shrink the normaliser a lot (a
dominant row moved away from sample j) that error would be amplified by S0_j / S_j. The walk therefore
stops before such a sample (S_j < S0_j / 16) or before a corrected logit exceeds the shift by more than
`_EXP_LIMIT`, and the driver starts a fresh block there: the block boundary moves, the result does not.
The row updates reproduce torch's rounding: float32 ops for float32 state, and for float16 state every
op computed in float32 and rounded to half, as torch's CPU half kernels do. float16 *prior* adaptation
is the one case that cannot be reproduced from a blocked posterior and runs the reference loop itself
(`needs_reference`).

Threads. With one torch thread the driver alternates a block's products and its walk. With more, torch
runs single-threaded ops in a pool of that many threads that computes the products of block b+1 (one
chunk per thread) from the state at the start of block b while block b is walked; block b+1 then
corrects for the rows changed in blocks b and b+1, so the walk never waits for a block boundary. After
an early stop the next block starts from the current state again. Independent configurations walk side
by side. No intra-op thread team ever has to meet at a barrier, which on a busy machine stalls each op
for a scheduler slice. Thread count and block length change only float rounding (products of other
shapes); the tests hold every setting to the reference.

Devices. The products run on the features' device; per chunk, its logits, normaliser and Q0 come to
the host in a few transfers, the walk runs on the host, and at the end of a block only the rows it
changed go back to the device copies of U and V. Results are returned on the features' device.
(Written for CUDA but only run on CPU so far: no GPU was available; tests/test_engine.py has the check.)
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numba
import numpy as np
import torch

from orchestrator.methods.base import TIMING_KEYS, Trace
from orchestrator.methods.reference import (STATE_DTYPES, UPDATES, BCAConfig, bca_family_reference,
                                            rows_of_classes)

# Block length: the walk's corrections cost O(B) per sample (rows changed since the products' base
# state), the products get cheaper per sample with B. At K = M = 1000, d = 512 on this 2-core machine
# 24 to 64 measured alike end to end (within the noise of a shared machine); the walk alone took
# ~6 us/sample for bca at 32, ~11 at 64, ~22 at 128.
DEFAULT_BLOCK = 32
# A block restarts before a sample whose softmax normaliser fell below 1/_DRIFT of its block-start value
# (keeps Q0's float32 error below ~2e-6 of the posterior) ...
_DRIFT = 16.0
# ... or whose corrected logit exceeds the block-start row max by this much (float64 exp stays finite).
_EXP_LIMIT = 80.0
_RULES = {name: i for i, name in enumerate(UPDATES)}  # count 0, momentum 1, decay 2


# ------------------------------------------------------------------------------------- compiled kernels

@numba.njit(cache=True, nogil=True)
def _to_half(x):
    """Round a float32 to the nearest float16 value (ties to even), returned as float32."""
    v = np.float64(x)
    if v == 0.0 or not math.isfinite(v):
        return x
    if abs(v) < 6.103515625e-05:  # below float16's smallest normal (2^-14): fixed quantum 2^-24
        r = np.rint(v * 16777216.0) / 16777216.0
    else:
        m, e = math.frexp(v)  # v = m * 2^e, 0.5 <= |m| < 1: keep 11 significant bits
        r = math.ldexp(np.rint(m * 2048.0), e - 11)
    if abs(r) > 65504.0:
        r = math.copysign(math.inf, v)
    return np.float32(r)


@numba.njit(cache=True, nogil=True)
def _round(x, half):
    return _to_half(x) if half else x


@numba.njit(cache=True, nogil=True)
def _norm(v, half):
    """torch.linalg.vector_norm of a row, summed in the order torch's CPU kernel uses.

    float16: one float32 accumulator, element by element, rounded to half at the end (an order that
    matters: the rounding to half amplifies a last-bit difference into a half ulp in every element).
    float32: AVX2 order, 8 lane accumulators summed in lane order, then the tail; this keeps U bitwise
    equal to the reference on AVX2 machines; elsewhere the two differ by a float32 ulp.
    """
    n = v.shape[0]
    acc = np.float32(0.0)
    if half:
        for i in range(n):
            acc = acc + v[i] * v[i]
        return _to_half(np.float32(math.sqrt(acc)))
    full = n - n % 8
    lanes = np.zeros(8, np.float32)
    for i in range(0, full, 8):
        for k in range(8):
            lanes[k] = lanes[k] + v[i + k] * v[i + k]
    for k in range(8):
        acc = acc + lanes[k]
    for i in range(full, n):
        acc = acc + v[i] * v[i]
    return np.float32(math.sqrt(acc))


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _dot(u, f):
    """float64 dot product of two float32 rows. Reassociation lets it vectorise; its rounding error
    (~1e-16) is far below the float32 error with which the reference's own products are computed."""
    acc = 0.0
    for k in range(u.shape[0]):
        acc += np.float64(u[k]) * np.float64(f[k])
    return acc


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum(q):
    """Sum of a float64 vector; reassociation lets it vectorise (the order shows only at ~1e-16)."""
    acc = 0.0
    for k in range(q.shape[0]):
        acc += q[k]
    return acc


@numba.njit(cache=True, nogil=True)
def _weights(rule, counter, n, decay):
    """reference.update_weights in float64, as Python evaluates it: (a, b, next counter)."""
    if rule == 0:
        return counter, 1.0, counter + 1.0
    if rule == 1:
        m = 1.0 / (n + 1.0)
        return 1.0 - m, m, counter + 1.0
    kept = decay * counter
    return kept, 1.0, kept + 1.0


@numba.njit(cache=True, nogil=True)
def _blend_into(row, x, a, b, half, out):
    """reference.blend: (a * row + b * x.to(dtype)) / (a + b); torch casts the Python scalars to float32."""
    a32 = np.float32(a)
    b32 = np.float32(b)
    ab32 = np.float32(a + b)
    for k in range(row.shape[0]):
        t1 = _round(a32 * row[k], half)
        t2 = _round(b32 * _round(x[k], half), half)
        out[k] = _round(_round(t1 + t2, half) / ab32, half)


@numba.njit(cache=True, nogil=True)
def _walk(F, Z0, shift, E0, S0, Q0, amax0,
          U, V, C1, C2, cls, row_of_class,
          adapt_u, adapt_v, select_post, v_onehot, half, rule,
          scale, tau_l, tau_p, n1, n2, decay,
          post, sel, gated, gated_prior,
          u_changed, v_changed, R, slot, Vstart, nR,
          wu, wv, W, wslot, Vsnap, nW,
          zc, ec, q, buf):
    """Walk B consecutive samples in stream order; returns (samples done, nR, nW).

    Inputs for the B samples, all against one base state (the state the products were computed from):
    F [B, d], Z0 [B, M] logits, shift [B] their row max, E0 [B, M] = exp(Z0 - shift), S0 [B] float64 row
    sums of E0, Q0 [B, K] = E0 V_base, amax0 [B] argmax of Z0. State U [M, d], V [M, K], C1, C2 [M]
    (float32; half-valued when `half`) is updated in place.
    Rows changed since the base: R[:nR], flagged in u_changed / v_changed, V_base[r] = Vstart[slot[r]].
    Rows changed since the current block started: W[:nW], flagged in wu / wv, with the block-start V rows
    in Vsnap[wslot[r]] (the base of a later block; see `_rebase`).
    The walk stops early (returns j < B) only before a sample whose corrections would lose precision;
    nothing of sample j has been written then.
    """
    B, d = F.shape
    M = U.shape[0]
    K = V.shape[1]
    for j in range(B):
        # 1. logits of rows updated earlier in the block, and the softmax normaliser
        sh = np.float64(shift[j])
        S = S0[j]
        for t in range(nR):
            r = R[t]
            if u_changed[r]:
                z = np.float32(_dot(U[r], F[j])) * scale
                if z - sh > _EXP_LIMIT:
                    return j, nR, nW
                zc[t] = z
                ec[t] = math.exp(np.float64(z) - sh)
                S += ec[t] - E0[j, r]
            else:
                ec[t] = E0[j, r]
        if S * _DRIFT < S0[j]:
            return j, nR, nW

        # 2. posterior: q = E V with the block-start terms of changed rows swapped for current ones
        for k in range(K):
            q[k] = Q0[j, k]
        for t in range(nR):
            r = R[t]
            e0 = np.float64(E0[j, r])
            vr = V[r]
            if v_changed[r]:
                vs = Vstart[slot[r]]
                e = ec[t]
                for k in range(K):
                    q[k] += e * vr[k] - e0 * vs[k]
            elif u_changed[r]:
                de = ec[t] - e0
                if v_onehot:
                    q[cls[r]] += de
                else:
                    for k in range(K):
                        q[k] += de * vr[k]
        inv_total = 1.0 / _sum(q)
        for k in range(K):
            post[j, k] = np.float32(q[k] * inv_total)
        if not (adapt_u or adapt_v):
            continue

        # 3. selection: the row s and its confidence (reference step 3)
        if select_post:
            best = 0
            for k in range(1, K):
                if post[j, k] > post[j, best]:
                    best = k
            conf = np.float64(post[j, best])
            s = row_of_class[best]
        else:
            s = amax0[j]
            zs = Z0[j, s]
            if nR > 0 and u_changed[s]:
                # the block-start argmax row moved: the best unchanged row, then the changed ones
                s = -1
                for m in range(M):
                    if not u_changed[m] and (s < 0 or Z0[j, m] > zs):
                        s = m
                        zs = Z0[j, m]
            es = -1.0
            for t in range(nR):
                r = R[t]
                if u_changed[r] and (s < 0 or zc[t] > zs or (zc[t] == zs and r < s)):
                    s = r
                    zs = zc[t]
                    es = ec[t]
            if es < 0.0:
                es = np.float64(E0[j, s])
            conf = es / S
        sel[j] = s

        # 4. gates and row updates (reference step 5); both use this sample's s, conf and post
        fire_u = adapt_u and conf > tau_l
        fire_v = adapt_v and conf > tau_p
        if (fire_u or fire_v) and not (u_changed[s] or v_changed[s]):
            slot[s] = nR
            R[nR] = s
            nR += 1
        if (fire_u or fire_v) and not (wu[s] or wv[s]):
            wslot[s] = nW
            W[nW] = s
            nW += 1
        if fire_u:
            a, b, c_next = _weights(rule, np.float64(C1[s]), n1, decay)
            _blend_into(U[s], F[j], a, b, half, buf)
            nrm = _norm(buf, half)
            for k in range(d):
                U[s, k] = _round(buf[k] / nrm, half)
            C1[s] = np.float32(c_next)
            gated[j] = True
            u_changed[s] = True
            wu[s] = True
        if fire_v:
            if not v_changed[s]:
                Vstart[slot[s]] = V[s]
                v_changed[s] = True
            if not wv[s]:
                Vsnap[wslot[s]] = V[s]
                wv[s] = True
            a, b, c_next = _weights(rule, np.float64(C2[s]), n2, decay)
            _blend_into(V[s], post[j], a, b, half, V[s])
            C2[s] = np.float32(c_next)
            gated_prior[j] = True
    return B, nR, nW


@numba.njit(cache=True, nogil=True)
def _rebase(u_changed, v_changed, R, slot, Vstart, nR, wu, wv, W, wslot, Vsnap, nW, keep):
    """End of a block. keep=True: the next block's products were computed from this block's start state,
    so 'changed since the base' becomes 'changed in this block' (W, with V rows from Vsnap).
    keep=False: the next products come from the current state; nothing is changed since. Returns nR."""
    for t in range(nR):
        u_changed[R[t]] = False
        v_changed[R[t]] = False
    for t in range(nW):
        r = W[t]
        if keep:
            R[t] = r
            slot[r] = t
            u_changed[r] = wu[r]
            v_changed[r] = wv[r]
            if wv[r]:
                Vstart[t] = Vsnap[wslot[r]]
        wu[r] = False
        wv[r] = False
    return nW if keep else 0


# ------------------------------------------------------------------------------------------ the driver

def _host(t: torch.Tensor) -> np.ndarray:
    """A host numpy view (no copy on the CPU; one transfer from a GPU)."""
    return t.detach().cpu().contiguous().numpy()


def _host_copy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy().copy()


@dataclass
class _Stream:
    """What every lane of one call shares: the features (device and host), block and chunk lengths, and
    the class maps (device class ids; host class ids and the row of each class for select_on='posterior')."""

    features: torch.Tensor
    host: np.ndarray
    block: int
    chunk: int
    cls: torch.Tensor
    maps: tuple[np.ndarray, np.ndarray]


@dataclass
class _Lane:
    """One configuration while a stream runs: host state (updated by the walk), device copies of U and V
    (the state the next products are computed from), the outputs in stream order, the walk's bookkeeping
    (`_walk`: base = (u_changed, v_changed, R, slot, Vstart) with nR rows, block = (wu, wv, W, wslot,
    Vsnap) with nW rows, work = (zc, ec, q, buf)) and the stage timings."""

    cfg: BCAConfig
    U: np.ndarray
    V: np.ndarray
    C1: np.ndarray
    C2: np.ndarray
    U_dev: torch.Tensor
    V_dev: torch.Tensor
    v_onehot: bool
    post: np.ndarray
    sel: np.ndarray
    gated: np.ndarray
    gated_prior: np.ndarray
    base: tuple[np.ndarray, ...]
    block: tuple[np.ndarray, ...]
    work: tuple[np.ndarray, ...]
    nR: int = 0
    nW: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMING_KEYS, 0.0))

    def walk(self, stream: _Stream, chunk: _Chunk, q0: np.ndarray, start: int) -> int:
        """Walk the chunk that starts at stream position `start`; returns the samples done."""
        cfg = self.cfg
        Z, shift, E, S, amax = chunk.logits
        end = start + Z.shape[0]
        t0 = time.perf_counter()
        done, self.nR, self.nW = _walk(
            stream.host[start:end], Z, shift, E, S, q0, amax, self.U, self.V, self.C1, self.C2, *stream.maps,
            cfg.adapt_likelihood, cfg.adapt_prior, cfg.select_on == "posterior", self.v_onehot,
            cfg.state_dtype == "float16", _RULES[cfg.update], np.float32(cfg.logit_scale), cfg.tau_likelihood,
            cfg.tau_prior, float(cfg.n1), float(cfg.n2), float(cfg.decay), self.post[start:end],
            self.sel[start:end], self.gated[start:end], self.gated_prior[start:end],
            *self.base, self.nR, *self.block, self.nW, *self.work)
        self.seconds["update"] += time.perf_counter() - t0
        return int(done)

    def end_block(self, keep: bool) -> None:
        """Copy the rows this block changed to the device copies, then rebase the bookkeeping: keep=True
        when the next block's products were computed from this block's start state (`_rebase`)."""
        wu, wv, W = self.block[:3]
        rows = W[:self.nW]
        for changed, host, dev in ((wu, self.U, self.U_dev), (wv, self.V, self.V_dev)):
            moved = rows[changed[rows]]
            if moved.size:
                dev[torch.from_numpy(moved).to(dev.device)] = torch.from_numpy(host[moved]).to(dev.device)
        self.nR = int(_rebase(*self.base, self.nR, *self.block, self.nW, keep))
        self.nW = 0

    def trace(self, device: torch.device) -> Trace:
        dtype = STATE_DTYPES[self.cfg.state_dtype]

        def out(a: np.ndarray, dt: torch.dtype | None = None) -> torch.Tensor:
            return torch.from_numpy(a).to(device=device, dtype=dt)

        state = {"U": out(self.U, dtype), "V": out(self.V, dtype), "C1": out(self.C1), "C2": out(self.C2)}
        return Trace(out(self.post), out(self.sel), out(self.gated), out(self.gated_prior), state=state,
                     timings=dict(self.seconds))


def _make_lane(state: dict[str, torch.Tensor], cfg: BCAConfig, onehot: torch.Tensor, n: int, block: int,
               device: torch.device) -> _Lane:
    U, V = _host_copy(state["U"]), _host_copy(state["V"])
    m, d = U.shape
    k = V.shape[1]
    # Without prior adaptation V keeps its initial one-hot rows: Q0 is then a scatter-add of E0 into the
    # classes instead of a product, and a changed U row moves one class's mass only.
    v_onehot = not cfg.adapt_prior and bool(torch.equal(state["V"].to(onehot.device, torch.float32), onehot))
    rows = max(min(block, n), 1)  # a block changes at most one row per sample; the base spans two blocks
    base = (np.zeros(m, np.bool_), np.zeros(m, np.bool_), np.zeros(2 * rows, np.int64), np.zeros(m, np.int64),
            np.zeros((2 * rows, k), np.float32))
    blk = (np.zeros(m, np.bool_), np.zeros(m, np.bool_), np.zeros(rows, np.int64), np.zeros(m, np.int64),
           np.zeros((rows, k), np.float32))
    work = (np.zeros(2 * rows, np.float32), np.zeros(2 * rows, np.float64), np.zeros(k, np.float64),
            np.zeros(d, np.float32))
    return _Lane(cfg, U, V, _host_copy(state["C1"]), _host_copy(state["C2"]),
                 torch.from_numpy(U).to(device, copy=True), torch.from_numpy(V).to(device, copy=True),
                 v_onehot, np.zeros((n, k), np.float32), np.full(n, -1, np.int64), np.zeros(n, np.bool_),
                 np.zeros(n, np.bool_), base, blk, work)


@dataclass
class _Chunk:
    """Products of a chunk of a block against the block-start state, on the host in `_walk`'s order."""

    logits: tuple[np.ndarray, ...]  # Z, shift, E0, S0, amax0
    q0: list[np.ndarray]            # Q0 = E0 V_start, one per lane
    seconds: tuple[float, float]    # wall time of the logits and of the Q0 products


def _chunk_products(Fc: torch.Tensor, U_dev: torch.Tensor, scale: float, lanes: list[_Lane],
                    cls: torch.Tensor) -> _Chunk:
    t0 = time.perf_counter()
    Z = (Fc @ U_dev.T).mul_(scale)  # the reference's logit_scale * (U32 @ f): product, then the scale
    shift, amax = Z.max(dim=1)
    E = torch.exp(Z - shift[:, None])
    S = E.sum(dim=1, dtype=torch.float64)
    logits = (_host(Z), _host(shift), _host(E), _host(S), _host(amax))
    t1 = time.perf_counter()
    q0 = []
    for lane in lanes:
        if lane.v_onehot:
            Q = torch.zeros(E.shape[0], lane.V_dev.shape[1], dtype=E.dtype, device=E.device).index_add_(1, cls, E)
        else:
            Q = E @ lane.V_dev
        q0.append(_host(Q))
    return _Chunk(logits, q0, (t1 - t0, time.perf_counter() - t1))


@dataclass
class _Pending:
    """A block whose products are being computed: its span in the stream and one future per chunk."""

    start: int
    end: int
    bounds: list[tuple[int, int]]
    futures: list[Future]


def _launch(stream: _Stream, lanes: list[_Lane], start: int, pool: Executor) -> _Pending:
    """Start the products of the block at `start` from the lanes' device copies as they are now."""
    head = lanes[0]
    end = min(start + stream.block, stream.host.shape[0])
    bounds = [(a, min(a + stream.chunk, end)) for a in range(start, end, stream.chunk)]
    futures = [pool.submit(_chunk_products, stream.features[a:b], head.U_dev, head.cfg.logit_scale, lanes,
                           stream.cls) for a, b in bounds]
    return _Pending(start, end, bounds, futures)


def _walk_block(stream: _Stream, lanes: list[_Lane], block: _Pending) -> int:
    """Walk the block chunk by chunk as its products arrive; returns where the walk stopped (the block's
    end, or the sample before which a lane's corrections would lose precision)."""
    for (a, b), future in zip(block.bounds, block.futures):
        chunk = future.result()
        for i, lane in enumerate(lanes):
            lane.seconds["logits"] += chunk.seconds[0] / len(lanes)
            lane.seconds["posterior"] += chunk.seconds[1] / len(lanes)
            done = lane.walk(stream, chunk, chunk.q0[i], a)
            if done < b - a:
                return a + done  # only a lane whose U adapts stops, and such a lane is alone in its group
    return block.end


def _run_group(stream: _Stream, lanes: list[_Lane], pool: Executor, lag: bool) -> None:
    """Run `lanes` (one lane, or lanes with the same fixed U that share the logits) over the stream.

    lag=False: each block's products come from the state at its own start. lag=True: the products of
    block b+1 are computed from the state at the start of block b, in `pool` while block b is walked, so
    the walk never waits for a block's first products; block b+1 then corrects for the rows changed in
    blocks b and b+1. After a stop the next block starts from the current state again.
    """
    n = stream.host.shape[0]
    block = _launch(stream, lanes, 0, pool) if n else None
    while block is not None:
        ahead = _launch(stream, lanes, block.end, pool) if lag and block.end < n else None
        try:
            stop = _walk_block(stream, lanes, block)
        finally:
            # pending products read the device copies that end_block is about to change
            wait(block.futures + (ahead.futures if ahead else []))
        restart = stop < block.end
        for lane in lanes:
            lane.end_block(keep=ahead is not None and not restart)
        if stop >= n:
            block = None
        elif ahead is not None and not restart:
            block = ahead
        else:
            block = _launch(stream, lanes, stop, pool)


class _Inline(Executor):
    """Runs each submitted call at once in the caller's thread (when the caller allows one thread)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:  # type: ignore[override]
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # delivered by future.result(), as a pool would
            future.set_exception(exc)
        return future


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_lanes(features: torch.Tensor, states: list[dict[str, torch.Tensor]], class_ids: torch.Tensor,
               num_classes: int, cfgs: list[BCAConfig], block: int) -> list[Trace]:
    if not cfgs:
        return []
    device = features.device
    n = features.shape[0]
    m = class_ids.shape[0]
    row_of_class = _host(rows_of_classes(class_ids, num_classes)) if m == num_classes else np.zeros(1, np.int64)
    # As many threads as the caller lets torch use (module docstring, Threads).
    workers = torch.get_num_threads()
    chunk = -(-block // workers)
    stream = _Stream(features, _host(features), block, chunk, class_ids.to(device),
                     (_host(class_ids).astype(np.int64), row_of_class))
    onehot = torch.nn.functional.one_hot(stream.cls, num_classes).to(torch.float32)
    lanes = [_make_lane(st, cfg, onehot, n, block, device) for st, cfg in zip(states, cfgs)]

    # Lanes whose U never adapts and that start from the same U and logit_scale share their logits; with U
    # fixed no logit is ever corrected, so their walks never stop early and their blocks stay aligned.
    groups: list[list[_Lane]] = []
    for lane in lanes:
        for group in groups:
            head = group[0]
            if not (lane.cfg.adapt_likelihood or head.cfg.adapt_likelihood) and \
                    head.cfg.logit_scale == lane.cfg.logit_scale and np.array_equal(head.U, lane.U):
                group.append(lane)
                break
        else:
            groups.append([lane])

    if workers == 1:
        for group in groups:
            _run_group(stream, group, _Inline(), lag=False)
    else:
        with _torch_threads(1), ThreadPoolExecutor(workers) as products, \
                ThreadPoolExecutor(min(workers, len(groups))) as walkers:
            for _ in walkers.map(lambda group: _run_group(stream, group, products, lag=True), groups):
                pass
    return [lane.trace(device) for lane in lanes]


def run_bca_blocked_many(features: torch.Tensor, states: list[dict[str, torch.Tensor]], class_ids: torch.Tensor,
                         num_classes: int, cfgs: list[BCAConfig], *, block: int = DEFAULT_BLOCK) -> list[Trace]:
    """G BCA-family configurations over one stream `features` [n, d]; each result equals
    `bca_family_reference(features, states[g], class_ids, num_classes, cfgs[g])`.

    states[g]: 'U' [M, d], 'V' [M, K] (in cfgs[g].state_dtype), 'C1', 'C2' [M] float32; not modified.
    Configurations whose U never adapts (clip, pa) and that start from the same U and logit_scale share
    one logits product per block; the others walk the stream each on its own. Independent configurations
    run side by side on the threads torch may use (torch.get_num_threads()).
    """
    if len(states) != len(cfgs):
        raise ValueError(f"got {len(states)} states for {len(cfgs)} configs; expected one state per config")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    blocked = [g for g, cfg in enumerate(cfgs) if not needs_reference(cfg)]
    traces = dict(zip(blocked, _run_lanes(features, [states[g] for g in blocked], class_ids, num_classes,
                                           [cfgs[g] for g in blocked], block)))
    for g, cfg in enumerate(cfgs):
        if g not in traces:
            traces[g] = bca_family_reference(features, states[g], class_ids, num_classes, cfg)
    return [traces[g] for g in range(len(cfgs))]


def needs_reference(cfg: BCAConfig) -> bool:
    """float16 prior adaptation runs the per-sample reference itself.

    The V update rounds the reference's float32 posterior to half. The engine's posterior agrees with it
    to ~1e-7 but not bitwise (block products sum in another order than the per-sample products), and
    where a value sits near a half rounding boundary that lands a half ulp (~2e-4) apart in V, which
    would persist and show in later posteriors. float16 U alone (`la`) is exact here: its update reads
    only the stored row and the feature, both bitwise equal to the reference's.
    """
    return cfg.state_dtype == "float16" and cfg.adapt_prior


def run_bca_blocked(features: torch.Tensor, state: dict[str, torch.Tensor], class_ids: torch.Tensor,
                    num_classes: int, cfg: BCAConfig, *, block: int = DEFAULT_BLOCK) -> Trace:
    """Drop-in for `reference.bca_family_reference` (same arguments, same Trace), computed in blocks."""
    return run_bca_blocked_many(features, [state], class_ids, num_classes, [cfg], block=block)[0]
