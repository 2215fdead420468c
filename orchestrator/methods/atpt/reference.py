"""A-TPT one sample at a time: TPT's per-sample loop (`orchestrator.methods.tpt.reference.run_reference`) with the
official angular term transcribed from clip/custom_clip.py (ang_norm_cal) and the two test_time_tuning entry points
(MB-Shihab-Aaqil-Ahamed/A-TPT@d76ecf6), the reference tests/test_tpt.py holds `atpt` to."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.prompt import PromptText
from orchestrator.methods.tpt.reference import run_reference


def min_ang_norm_mean(W: torch.Tensor, tau: float) -> torch.Tensor:
    """[K, d] class text features -> the official mean of -arccos of each class's nearest other cosine."""
    W_ = F.normalize(W, p=2, dim=1)
    Wwt_ = torch.matmul(W_, W_.t())
    Wwt_ = Wwt_ - 2. * torch.diag(torch.diag(Wwt_))
    max_Wwt_ = Wwt_.max(dim=1)[0]
    return (-torch.acos(max_Wwt_.clamp(-tau, tau))).mean()


def run_atpt_reference(views: torch.Tensor, text: PromptText, lambda_term: float, tau_term: float, direction: str,
                       **tuning) -> torch.Tensor:
    """[n, V, d] views -> [n, K] posteriors; direction 'maximise': tpt_classification.py's
    `loss += lambda * min_ang_norm_mean`, 'minimise': atpt_classification.py's `loss += (-lambda) * ...`."""
    sign = 1.0 if direction == "maximise" else -1.0
    return run_reference(views, text, **tuning, extra=lambda t: sign * lambda_term * min_ang_norm_mean(t, tau_term))
