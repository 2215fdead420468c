"""Plugin modules the tests write to disk as a user would (their source text)."""

# A user's method outside orchestrator/methods, one module: a card registered by register_method.
SHARPEN = '''
"""A user's method outside orchestrator/methods: CLIP with its own softmax scale."""
import torch

from orchestrator.methods.base import Method, Trace, empty_trace
from orchestrator.registry import HParam, MethodCard, register_method


class Sharpen(Method):
    name = "sharpen"

    def _run(self, features):
        n, k = features.shape[0], self.num_classes
        posteriors, selected, gated, gated_prior = empty_trace(n, k, features.device)
        p = torch.softmax(self.hp["scale"] * features @ self.class_embeddings.T, dim=1)
        posteriors.index_add_(1, self.class_ids, p)
        return Trace(posteriors, selected, gated, gated_prior)


register_method(MethodCard(
    "sharpen", "Sharpened CLIP", 95, "toy", "nothing: CLIP with its own scale", Sharpen,
    (HParam("scale", "float", 50.0, "softmax scale of the cosines", "scale", low=0.0, low_open=True, log=True),)))
'''
