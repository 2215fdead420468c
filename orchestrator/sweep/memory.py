"""A trial's own peak memory: the GPU allocator's peak on CUDA; on the CPU the growth of the process's resident
size over the trial, sampled by a thread, since a reused Ray actor's lifetime peak (ru_maxrss) is every earlier
trial's as much as this one's."""

from __future__ import annotations

import os
import threading

import torch

_INTERVAL_S = 0.005
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
        if self.cuda:
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
            return torch.cuda.max_memory_allocated() / 2**20
        self._max = max(self._max, _rss_bytes())
        return (self._max - self._base) / 2**20

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
