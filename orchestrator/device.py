"""The one device rule: the GPU when torch sees one, else the CPU (encoders, text embeddings and trials)."""

from __future__ import annotations

import torch


def auto_device(device: str | torch.device | None = None) -> torch.device:
    """`device` as a torch.device; None or 'auto' means cuda when available, else cpu."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
