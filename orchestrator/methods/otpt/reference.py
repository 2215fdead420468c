"""O-TPT one sample at a time: TPT's per-sample loop (`orchestrator.methods.tpt.reference.run_reference`) with the
official Householder term transcribed from otpt_classification.py test_time_tuning (ashshaksharifdeen/O-TPT@a09933f),
the reference tests/test_tpt.py holds `otpt` to."""

from __future__ import annotations

import torch

from orchestrator.methods.prompt import PromptText
from orchestrator.methods.tpt.reference import run_reference


def householder_term(text_feature: torch.Tensor) -> torch.Tensor:
    """[K, d] normalised class text features -> the official scalar term, step by step as the code builds it."""
    Wwt = text_feature @ text_feature.T
    e = torch.eye(Wwt.shape[1], dtype=Wwt.dtype)
    M_norm = torch.linalg.norm(Wwt, dim=0, keepdim=True)
    u = Wwt - e * M_norm
    v = u / torch.linalg.norm(u, dim=-1, keepdim=True)
    transformed = e.unsqueeze(0).expand(Wwt.shape[1], -1, -1) - 2 * (v.unsqueeze(2) @ v.unsqueeze(1))
    Hx = torch.bmm(transformed, Wwt.unsqueeze(2)).squeeze(2)
    return torch.linalg.norm(Hx - e, dim=-1).mean()


def run_otpt_reference(views: torch.Tensor, text: PromptText, lambda_term: float, **tuning) -> torch.Tensor:
    """[n, V, d] views -> [n, K] posteriors; tuning: run_reference's lr, steps, keep, logit_scale."""
    return run_reference(views, text, **tuning, extra=lambda t: lambda_term * householder_term(t))
