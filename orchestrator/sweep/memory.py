"""A trial's own peak memory: the GPU allocator's peak on CUDA; on the CPU the growth of the process's resident
size over the trial, sampled by a thread, since a reused Ray actor's lifetime peak (ru_maxrss) is every earlier
trial's as much as this one's. `MethodCost`: the seconds and peak memory of one method's pass inside a trial
(the runs table's latency_ms and method_mem_mb)."""

from __future__ import annotations

import os
import threading
import time

import torch

_INTERVAL_S = 0.005
# The CUDA allocator's peak before a MethodCost reset it, so that the enclosing PeakMemory still sees it.
_CUDA_PEAK = 0
_clock = time.perf_counter  # MethodCost's clock (a test's fake one makes its seconds exact)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


class PeakMemory:
    """`with PeakMemory(device) as peak: ...; peak.mb()` is the peak so far of this block, in MiB."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._stop = threading.Event()
        self._base = self._max = 0
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakMemory":
        global _CUDA_PEAK
        if self.cuda:
            _CUDA_PEAK = 0
            torch.cuda.reset_peak_memory_stats()
        else:
            self._base = self._max = _rss_bytes()
            self._thread = threading.Thread(target=self._sample, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(_INTERVAL_S):
            self._max = max(self._max, _rss_bytes())

    def mb(self) -> float:
        if self.cuda:
            return max(_CUDA_PEAK, torch.cuda.max_memory_allocated()) / 2**20
        self._max = max(self._max, _rss_bytes())
        return (self._max - self._base) / 2**20

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class MethodCost:
    """`with MethodCost(device) as cost: ...`: the block's seconds (the device synchronised at both ends) and its
    peak memory above what was allocated when it began, in MiB: the CUDA allocator's, or on the CPU the growth of
    the resident size (best effort: pages freed earlier in the process may be reused without growing it)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds = 0.0
        self.mb = 0.0
        self._rss: PeakMemory | None = None

    def __enter__(self) -> "MethodCost":
        global _CUDA_PEAK
        if self.cuda:
            torch.cuda.synchronize()
            _CUDA_PEAK = max(_CUDA_PEAK, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._rss = PeakMemory(torch.device("cpu")).__enter__()
        self._began = _clock()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = _clock() - self._began
        if self.cuda:
            self.mb = (torch.cuda.max_memory_allocated() - self._base) / 2**20
        else:
            self.mb = self._rss.mb()
            self._rss.__exit__(*exc)
