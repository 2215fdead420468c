"""Exact blocked engine for the BCA family (clip, la, pa, bca): the semantics of
`orchestrator.methods.bca.reference.bca_family_reference`, at matrix-product speed.

Why blocks: the per-sample loop does two matrix-vector products per sample (logits U f, posterior p V)
plus a dozen small tensor ops, and on a CPU the small ops cost more than the products. Here a block of B
samples gets its logits from ONE product against the block-start state, Z0 = logit_scale * F_B U^T, and its
unnormalised posteriors from ONE product Q0 = exp(Z0 - shift) V. A compiled walk (numba) then visits the
block's samples in stream order and corrects both for exactly the rows of U and V that changed since the
block started:

    z_j[r]  = logit_scale * U_now[r] . f_j                       for rows r whose U row changed
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
A changed row whose weight in sample j is below `_NEGLIGIBLE` (1e-9) of S_j both before and after its
change moves q_j by less than that (rows of V sum to 1), so its q correction is skipped: at most
B * 1e-9 of the posterior, far below Q0's own rounding; at K = M = 1000 this skips about three rows in four.
The row updates reproduce torch's rounding: float32 ops for float32 state, and for float16 state every
op computed in float32 and rounded to half, as torch's CPU half kernels do. float16 *prior* adaptation
is the one case that cannot be reproduced from a blocked posterior and runs the reference loop itself
(`needs_reference`).

Sharing. Configurations whose U stays equal over any stream share one logits product per block: those
whose U never adapts and starts equal, and those whose U adapts by the same rule (tau_likelihood, n1,
update, select_on='likelihood'), since then each sample's row, confidence and likelihood gate come from
the logits alone. A tau / n1 / n2 sweep thus computes F U^T once per (tau, n1), not once per n2.

Threads. One configuration group (or one torch thread): blocks run one after another, the products on
`product_threads` threads (default 1), the walk on the calling thread. One thread is the default because
intra-op threads wait for each other at every product's barrier: with the other core busy, two product
threads ran a single BCA config about ten times slower than one and twice as unevenly (`python -m
benchmarks.engine --repeat 7 --load`); they gain ~20% only on an idle machine. Several groups: they run side
by side, one thread each, with single-threaded products, so no thread waits at another's barrier. (Computing block b+1's products
on a second thread while block b is walked was tried and measured slower: the walk then also corrects for
block b's rows; see docs/performance.md and `python -m benchmarks.engine`.)
Thread count and block length change only float rounding (products of other shapes); the tests hold
every setting to the reference.

Devices. The products run on the features' device; a block's logits, normaliser and Q0 come to the
host in a few transfers into pinned buffers, the walk runs on the host, and at the end of a block only
the rows it changed go to the device copies of U and V (on a CPU the products read the host state
itself). Results are returned on the features' device. (Written for CUDA but only run on CPU so far:
no GPU was available; tests/test_engine.py has the check.)
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numba
import numpy as np
import torch

from orchestrator.methods.base import Trace
from orchestrator.methods.bca.reference import STATE_DTYPES, UPDATES, BCAConfig, bca_family_reference, rows_of_classes
from orchestrator.stages import METHOD_STAGES

# Block length: the walk's corrections cost O(B) per sample (rows changed since the block started), the
# products get cheaper per sample with B (fewer packings of U and V, fewer thread barriers); 128 measured
# best of 64 / 128 / 192 (`python -m benchmarks.engine`).
DEFAULT_BLOCK = 128
# A block restarts before a sample whose softmax normaliser fell below 1/_DRIFT of its block-start value
# (keeps Q0's float32 error below ~2e-6 of the posterior) ...
_DRIFT = 16.0
# ... or whose corrected logit exceeds the block-start row max by this much (float64 exp stays finite).
_EXP_LIMIT = 80.0
# A changed row whose exp-weight in a sample is below this fraction of the sample's normaliser (before
# and after the change) is left out of that sample's posterior correction: at K = M = 1000 about three
# rows in four, each shifting the posterior by under 1e-9.
_NEGLIGIBLE = 1e-9
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
          zc, ec, q, buf):
    """Walk B consecutive samples in stream order; returns (samples done, nR).

    Inputs for the B samples, all against the state at the block's start (the base):
    F [B, d], Z0 [B, M] logits, shift [B] their row max, E0 [B, M] = exp(Z0 - shift), S0 [B] float64 row
    sums of E0, Q0 [B, K] = E0 V_base, amax0 [B] argmax of Z0. State U [M, d], V [M, K], C1, C2 [M]
    (float32; half-valued when `half`) is updated in place.
    Rows changed since the base: R[:nR], flagged in u_changed / v_changed, V_base[r] = Vstart[slot[r]].
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
                    return j, nR
                zc[t] = z
                ec[t] = math.exp(np.float64(z) - sh)
                S += ec[t] - E0[j, r]
            else:
                ec[t] = E0[j, r]
        if S * _DRIFT < S0[j]:
            return j, nR

        # 2. posterior: q = E V with the block-start terms of changed rows swapped for current ones.
        # A row's swap moves q by at most e + e0 in total (rows of V sum to 1); below _NEGLIGIBLE * S it
        # is skipped, so the posterior moves by at most nR * _NEGLIGIBLE (module docstring, Numerics).
        for k in range(K):
            q[k] = Q0[j, k]
        small = _NEGLIGIBLE * S
        for t in range(nR):
            r = R[t]
            e0 = np.float64(E0[j, r])
            e = ec[t]
            if e + e0 < small:
                continue
            vr = V[r]
            if v_changed[r]:
                vs = Vstart[slot[r]]
                for k in range(K):
                    q[k] += e * vr[k] - e0 * vs[k]
            elif u_changed[r]:
                if v_onehot:
                    q[cls[r]] += e - e0
                else:
                    de = e - e0
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
        if fire_u:
            a, b, c_next = _weights(rule, np.float64(C1[s]), n1, decay)
            _blend_into(U[s], F[j], a, b, half, buf)
            nrm = _norm(buf, half)
            for k in range(d):
                U[s, k] = _round(buf[k] / nrm, half)
            C1[s] = np.float32(c_next)
            gated[j] = True
            u_changed[s] = True
        if fire_v:
            if not v_changed[s]:
                Vstart[slot[s]] = V[s]
                v_changed[s] = True
            a, b, c_next = _weights(rule, np.float64(C2[s]), n2, decay)
            _blend_into(V[s], post[j], a, b, half, V[s])
            C2[s] = np.float32(c_next)
            gated_prior[j] = True
    return B, nR


@numba.njit(cache=True, nogil=True)
def _rebase(u_changed, v_changed, R, nR):
    """The end of a block: the next block's products come from the current state, so no row has changed
    since its base."""
    for t in range(nR):
        u_changed[R[t]] = False
        v_changed[R[t]] = False


# ------------------------------------------------------------------------------------------ the driver

def _host(t: torch.Tensor) -> np.ndarray:
    """A host numpy view (no copy on the CPU; one transfer from a GPU)."""
    return t.detach().cpu().contiguous().numpy()


def _host_copy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy().copy()


@dataclass
class _Stream:
    """What every group of one call shares: the features (device and host), the block length, and the
    class maps (device class ids; host class ids and the row of each class for select_on='posterior')."""

    features: torch.Tensor
    host: np.ndarray
    block: int
    cls: torch.Tensor
    maps: tuple[np.ndarray, np.ndarray]


@dataclass
class _Products:
    """Buffers for one block's products against the block-start state, allocated once per group: Z [B, M]
    logits, shift [B] their row max, amax [B] its argmax, E [B, M] = exp(Z - shift), S [B] float64 row sums
    of E, then Q [B, K] = E V for each lane. `dev` is where the products run (the features' device); `host`
    is what the walk reads: numpy views of the same memory on a CPU, of pinned copies (`pinned`) of a GPU's."""

    dev: tuple[torch.Tensor, ...]
    pinned: tuple[torch.Tensor, ...]
    host: tuple[np.ndarray, ...]

    @classmethod
    def allocate(cls, block: int, m: int, k: int, lanes: int, device: torch.device) -> _Products:
        def make(dev: torch.device, pin: bool) -> tuple[torch.Tensor, ...]:
            def empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
                return torch.empty(*shape, dtype=dtype, device=dev, pin_memory=pin)
            return (empty(block, m), empty(block), empty(block, dtype=torch.int64), empty(block, m),
                    empty(block, dtype=torch.float64), *(empty(block, k) for _ in range(lanes)))

        dev = make(device, False)
        pinned = dev if device.type == "cpu" else make(torch.device("cpu"), True)
        return cls(dev, pinned, tuple(t.numpy() for t in pinned))

    def compute(self, F: torch.Tensor, U: torch.Tensor, scale: float, V: list[torch.Tensor | None],
                cls: torch.Tensor) -> tuple[float, float]:
        """The first len(F) rows of every buffer from features F; V[g] None: lane g's V is its one-hot start,
        so its Q is a scatter-add of E into the classes. Returns the seconds of the logits and of the Qs."""
        Z, shift, amax, E, S, *Q = (t[:F.shape[0]] for t in self.dev)
        t0 = time.perf_counter()
        torch.matmul(F, U.T, out=Z).mul_(scale)  # the reference's logit_scale * (U32 @ f): product, then scale
        torch.max(Z, dim=1, out=(shift, amax))
        torch.sub(Z, shift[:, None], out=E).exp_()
        torch.sum(E, dim=1, dtype=torch.float64, out=S)
        t1 = time.perf_counter()
        for q, v in zip(Q, V):
            if v is None:
                q.zero_().index_add_(1, cls, E)
            else:
                torch.matmul(E, v, out=q)
        if self.pinned is not self.dev:
            for src, dst in zip(self.dev, self.pinned):
                dst[:F.shape[0]].copy_(src[:F.shape[0]])
        return t1 - t0, time.perf_counter() - t1


@dataclass
class _Lane:
    """One configuration while a stream runs: host state (updated by the walk), the device copy of V that
    products use (None while V is its one-hot start and never adapts; on a CPU the host V itself), the
    outputs in stream order, the walk's bookkeeping (`_walk`: base = (u_changed, v_changed, R, slot, Vstart)
    with nR rows, work = (zc, ec, q, buf)) and the stage timings."""

    cfg: BCAConfig
    U: np.ndarray
    V: np.ndarray
    C1: np.ndarray
    C2: np.ndarray
    V_dev: torch.Tensor | None
    post: np.ndarray
    sel: np.ndarray
    gated: np.ndarray
    gated_prior: np.ndarray
    base: tuple[np.ndarray, ...]
    work: tuple[np.ndarray, ...]
    nR: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METHOD_STAGES, 0.0))

    def walk(self, stream: _Stream, products: tuple[np.ndarray, ...], q0: np.ndarray, start: int, end: int) -> int:
        """Walk stream positions start:end (rows 0:end-start of the products); returns the samples done."""
        cfg = self.cfg
        Z, shift, amax, E, S, q0 = (p[:end - start] for p in (*products, q0))
        t0 = time.perf_counter()
        done, self.nR = _walk(
            stream.host[start:end], Z, shift, E, S, q0, amax, self.U, self.V, self.C1, self.C2,
            *stream.maps, cfg.adapt_likelihood, cfg.adapt_prior, cfg.select_on == "posterior", self.V_dev is None,
            cfg.state_dtype == "float16", _RULES[cfg.update], np.float32(cfg.logit_scale), cfg.tau_likelihood,
            cfg.tau_prior, float(cfg.n1), float(cfg.n2), float(cfg.decay), self.post[start:end],
            self.sel[start:end], self.gated[start:end], self.gated_prior[start:end], *self.base, self.nR,
            *self.work)
        self.seconds["update"] += time.perf_counter() - t0
        return int(done)

    def end_block(self) -> None:
        """Copy the V rows this block changed to the device copy (when it is not the host V), then clear the
        bookkeeping: the next block's products come from the current state."""
        u_changed, v_changed, R = self.base[:3]
        if self.V_dev is not None:
            _sync_rows(self.V, self.V_dev, R[:self.nR], v_changed)
        _rebase(u_changed, v_changed, R, self.nR)
        self.nR = 0

    def trace(self, device: torch.device) -> Trace:
        dtype = STATE_DTYPES[self.cfg.state_dtype]

        def out(a: np.ndarray, dt: torch.dtype | None = None) -> torch.Tensor:
            return torch.from_numpy(a).to(device=device, dtype=dt)

        state = {"U": out(self.U, dtype), "V": out(self.V, dtype), "C1": out(self.C1), "C2": out(self.C2)}
        return Trace(out(self.post), out(self.sel), out(self.gated), out(self.gated_prior), state=state,
                     timings=dict(self.seconds))


def _sync_rows(host: np.ndarray, dev: torch.Tensor, rows: np.ndarray, changed: np.ndarray) -> None:
    """Copy the flagged rows of the host state to its device copy (nothing to do where they share memory)."""
    if dev.device.type == "cpu":
        return
    moved = rows[changed[rows]]
    if moved.size:
        dev[torch.from_numpy(moved).to(dev.device)] = torch.from_numpy(host[moved]).to(dev.device)


def _device_copy(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """What the products read: the host array itself on a CPU (a block's products are computed before its
    walk changes anything), a copy kept in step by `_sync_rows` elsewhere."""
    return torch.from_numpy(host) if device.type == "cpu" else torch.from_numpy(host).to(device)


def _make_lane(state: dict[str, torch.Tensor], cfg: BCAConfig, onehot: torch.Tensor, n: int, block: int,
               device: torch.device) -> _Lane:
    U, V = _host_copy(state["U"]), _host_copy(state["V"])
    m, d = U.shape
    k = V.shape[1]
    # Without prior adaptation V keeps its initial one-hot rows: Q0 is then a scatter-add of E0 into the
    # classes instead of a product, and a changed U row moves one class's mass only.
    v_onehot = not cfg.adapt_prior and bool(torch.equal(state["V"].to(onehot.device, torch.float32), onehot))
    rows = max(min(block, n), 1)  # a block changes at most one row per sample
    base = (np.zeros(m, np.bool_), np.zeros(m, np.bool_), np.zeros(rows, np.int64), np.zeros(m, np.int64),
            np.zeros((rows, k), np.float32))
    work = (np.zeros(rows, np.float32), np.zeros(rows, np.float64), np.zeros(k, np.float64), np.zeros(d, np.float32))
    return _Lane(cfg, U, V, _host_copy(state["C1"]), _host_copy(state["C2"]),
                 None if v_onehot else _device_copy(V, device), np.zeros((n, k), np.float32),
                 np.full(n, -1, np.int64), np.zeros(n, np.bool_), np.zeros(n, np.bool_), base, work)


def _same_logits(a: _Lane, b: _Lane) -> bool:
    """Whether two lanes' U, and so their logits, stay equal over any stream. U fixed: the same start U and
    logit_scale. U adapting: also the same U-side rule; with select_on='likelihood' the row, confidence and
    likelihood gate of every sample come from the logits alone, so V never feeds back into U."""
    x, y = a.cfg, b.cfg
    if x.logit_scale != y.logit_scale or x.adapt_likelihood != y.adapt_likelihood or not np.array_equal(a.U, b.U):
        return False
    if not x.adapt_likelihood:
        return True
    return (x.select_on == y.select_on == "likelihood" and x.state_dtype == y.state_dtype
            and (x.tau_likelihood, x.n1, x.update) == (y.tau_likelihood, y.n1, y.update)
            and (x.update != "decay" or x.decay == y.decay) and np.array_equal(a.C1, b.C1))


@dataclass
class _Group:
    """Lanes whose logits are equal (`_same_logits`): one logits product per block serves them all. U_dev is
    what the products read for their U (the head lane's)."""

    lanes: list[_Lane]
    U_dev: torch.Tensor
    products: _Products

    def run(self, stream: _Stream) -> None:
        """Each block: its products from the state at its start, then the walk, sample by sample, of every
        lane. A walk that stops early (precision, see `_walk`) ends the block there."""
        n = stream.host.shape[0]
        head = self.lanes[0]
        V = [lane.V_dev for lane in self.lanes]
        start = 0
        while start < n:
            end = min(start + stream.block, n)
            seconds = self.products.compute(stream.features[start:end], self.U_dev, head.cfg.logit_scale, V,
                                            stream.cls)
            host = self.products.host
            done = set()
            for i, lane in enumerate(self.lanes):
                lane.seconds["logits"] += seconds[0] / len(self.lanes)
                lane.seconds["posterior"] += seconds[1] / len(self.lanes)
                done.add(lane.walk(stream, host[:5], host[5 + i], start, end))
            if len(done) > 1:  # only U's corrections stop a walk, and the lanes' U is the same
                raise RuntimeError(f"lanes with equal logits stopped at different samples {sorted(done)}")
            _sync_rows(head.U, self.U_dev, head.base[2][:head.nR], head.base[0])
            for lane in self.lanes:
                lane.end_block()
            start += done.pop()


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_lanes(features: torch.Tensor, states: list[dict[str, torch.Tensor]], class_ids: torch.Tensor,
               num_classes: int, cfgs: list[BCAConfig], block: int, product_threads: int) -> list[Trace]:
    if not cfgs:
        return []
    device = features.device
    n = features.shape[0]
    m = class_ids.shape[0]
    row_of_class = _host(rows_of_classes(class_ids, num_classes)) if m == num_classes else np.zeros(1, np.int64)
    block = max(min(block, n), 1)
    stream = _Stream(features, _host(features), block, class_ids.to(device),
                     (_host(class_ids).astype(np.int64), row_of_class))
    onehot = torch.nn.functional.one_hot(stream.cls, num_classes).to(torch.float32)
    lanes = [_make_lane(st, cfg, onehot, n, block, device) for st, cfg in zip(states, cfgs)]
    kinds: list[list[_Lane]] = []
    for lane in lanes:
        same = next((kind for kind in kinds if _same_logits(kind[0], lane)), None)
        if same is None:
            kinds.append([lane])
        else:
            same.append(lane)
    groups = [_Group(kind, _device_copy(kind[0].U, device),
                     _Products.allocate(block, m, num_classes, len(kind), device)) for kind in kinds]

    # Threads (module docstring): one group uses them inside its products; several run side by side.
    workers = torch.get_num_threads()
    if workers == 1 or len(groups) == 1:
        with _torch_threads(product_threads):
            for group in groups:
                group.run(stream)
    else:
        with _torch_threads(1), ThreadPoolExecutor(min(workers, len(groups))) as pool:
            for _ in pool.map(lambda group: group.run(stream), groups):
                pass
    return [lane.trace(device) for lane in lanes]


def run_bca_blocked_many(features: torch.Tensor, states: list[dict[str, torch.Tensor]], class_ids: torch.Tensor,
                         num_classes: int, cfgs: list[BCAConfig], *, block: int = DEFAULT_BLOCK,
                         product_threads: int = 1) -> list[Trace]:
    """G BCA-family configurations over one stream `features` [n, d]; each result equals
    `bca_family_reference(features, states[g], class_ids, num_classes, cfgs[g])`.

    states[g]: 'U' [M, d], 'V' [M, K] (in cfgs[g].state_dtype), 'C1', 'C2' [M] float32; not modified.
    Configurations whose U evolves identically share one logits product per block (see "Sharing" above:
    U never adapts and starts equal, or adapts by the same tau_likelihood, n1 and update rule selecting on
    the likelihood); each still walks the stream with its own prior. Independent groups run side by side on
    the threads torch may use (torch.get_num_threads()); a single group's products use `product_threads`.
    """
    if len(states) != len(cfgs):
        raise ValueError(f"got {len(states)} states for {len(cfgs)} configs; expected one state per config")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    if not isinstance(product_threads, int) or product_threads < 1:
        raise ValueError(f"product_threads must be a positive integer, got {product_threads!r}")
    blocked = [g for g, cfg in enumerate(cfgs) if not needs_reference(cfg)]
    traces = dict(zip(blocked, _run_lanes(features, [states[g] for g in blocked], class_ids, num_classes,
                                           [cfgs[g] for g in blocked], block, product_threads)))
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
                    num_classes: int, cfg: BCAConfig, *, block: int = DEFAULT_BLOCK, product_threads: int = 1) -> Trace:
    """Drop-in for `reference.bca_family_reference` (same arguments, same Trace), computed in blocks."""
    return run_bca_blocked_many(features, [state], class_ids, num_classes, [cfg], block=block,
                                product_threads=product_threads)[0]
