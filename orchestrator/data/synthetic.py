"""The embedded synthetic benchmark: CLIP-like embeddings that need no weights and no images.

A simulator for tests and demos, not a stand-in for real CLIP features. It reproduces the structure
that online test-time adaptation exploits, with every knob explicit:

- K text anchors ``t_k`` on the unit sphere (the zero-shot class embeddings; with ``templates_per_class``
  t > 1, each class gets t prompt embeddings jittered around its anchor, embedding m belonging to class m % K).
- A modality gap: every image feature carries a shared offset ``g`` that no text embedding has, so raw
  image-text cosines sit in a narrow band as they do in CLIP (about 0.2-0.35), and logit_scale 100 matters.
- A domain shift of chosen severity: the image-side class centre is the anchor pulled towards a random
  class-specific direction, ``c_k = normalise(t_k + shift * r_k + gap * g)``. Zero-shot CLIP classifies
  against ``t_k``; adapting the class embeddings towards the image centres (BCA's likelihood) recovers
  accuracy, and a skewed label distribution rewards prior adaptation.
- Isotropic noise: ``f = normalise(c_y + noise * e / sqrt(d))``, e ~ N(0, I).

Scenarios decide the label sequence (the stream order is part of the benchmark, so the stream is
returned already ordered):

- ``iid``: uniform class frequencies, seeded shuffle.
- ``label_shift``: class frequencies drawn from Dirichlet(``dirichlet_alpha``), i.i.d. order.
- ``temporal``: class-correlated runs (geometric run lengths with mean ``mean_run_length``): a non-i.i.d. order.
- ``continual``: ``num_domains`` consecutive domains, each with its own shift directions ``r_k``.

Deterministic: the same arguments give bit-identical tensors.
"""

from __future__ import annotations

import math

import torch

from orchestrator.data.types import Benchmark

SYNTHETIC_SCENARIOS = ("iid", "label_shift", "temporal", "continual")


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _label_sequence(scenario: str, n: int, num_classes: int, gen: torch.Generator, dirichlet_alpha: float,
                    mean_run_length: float) -> torch.Tensor:
    if scenario in ("iid", "continual"):
        return torch.randint(num_classes, (n,), generator=gen)
    if scenario == "label_shift":
        # torch.distributions takes no generator, so the Dirichlet is drawn from the seeded generator by hand.
        freqs = _seeded_dirichlet(num_classes, dirichlet_alpha, gen)
        return torch.multinomial(freqs, n, replacement=True, generator=gen)
    # temporal: runs of one class with geometric lengths, classes drawn uniformly per run.
    labels = torch.empty(n, dtype=torch.int64)
    stop_prob = 1.0 / max(mean_run_length, 1.0)
    pos = 0
    while pos < n:
        u = torch.rand((), generator=gen, dtype=torch.float64).clamp_min(1e-12)
        length = 1 + int(math.log(float(u)) / math.log1p(-stop_prob)) if stop_prob < 1.0 else 1
        labels[pos:pos + length] = int(torch.randint(num_classes, (), generator=gen))
        pos += length
    return labels


def _seeded_dirichlet(k: int, alpha: float, gen: torch.Generator) -> torch.Tensor:
    """Dirichlet(alpha) via normalised Gamma draws (Marsaglia-Tsang), using only the seeded generator."""
    boost = alpha < 1.0
    a = alpha + 1.0 if boost else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    draws = []
    for _ in range(k):
        while True:
            x = float(torch.randn((), generator=gen, dtype=torch.float64))
            v = (1.0 + c * x) ** 3
            if v <= 0:
                continue
            u = float(torch.rand((), generator=gen, dtype=torch.float64))
            if math.log(max(u, 1e-300)) < 0.5 * x * x + d - d * v + d * math.log(v):
                g = d * v
                break
        if boost:
            g *= float(torch.rand((), generator=gen, dtype=torch.float64)) ** (1.0 / alpha)
        draws.append(max(g, 1e-300))
    w = torch.tensor(draws, dtype=torch.float64)
    return w / w.sum()


def make_synthetic(
    scenario: str = "iid",
    *,
    num_classes: int = 50,
    dim: int = 128,
    n: int = 4000,
    seed: int = 0,
    templates_per_class: int = 1,
    shift: float = 1.6,
    gap: float = 1.0,
    noise: float = 1.6,
    template_jitter: float = 0.15,
    dirichlet_alpha: float = 0.3,
    mean_run_length: float = 20.0,
    num_domains: int = 3,
) -> Benchmark:
    """Build one synthetic benchmark (see the module docstring for the generative model)."""
    if scenario not in SYNTHETIC_SCENARIOS:
        raise ValueError(f"unknown synthetic scenario {scenario!r}; expected one of {', '.join(SYNTHETIC_SCENARIOS)}")
    for name, value, low in (("num_classes", num_classes, 2), ("dim", dim, 2), ("n", n, 1),
                             ("templates_per_class", templates_per_class, 1), ("num_domains", num_domains, 1)):
        if int(value) != value or value < low:
            raise ValueError(f"synthetic {name} must be an integer >= {low}, got {value!r}")
    for name, value in (("shift", shift), ("gap", gap), ("noise", noise), ("template_jitter", template_jitter)):
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"synthetic {name} must be a finite number >= 0, got {value!r}")
    if not dirichlet_alpha > 0:
        raise ValueError(f"synthetic dirichlet_alpha must be > 0, got {dirichlet_alpha!r}")
    if not mean_run_length >= 1:
        raise ValueError(f"synthetic mean_run_length must be >= 1, got {mean_run_length!r}")

    gen = torch.Generator().manual_seed(int(seed))
    k, d = num_classes, dim
    anchors = _unit_rows(torch.randn(k, d, generator=gen, dtype=torch.float64))
    gap_dir = _unit_rows(torch.randn(d, generator=gen, dtype=torch.float64))
    jitter = torch.randn(templates_per_class, k, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    class_embeddings = _unit_rows(anchors.unsqueeze(0) + template_jitter * jitter).reshape(templates_per_class * k, d)
    class_ids = torch.arange(templates_per_class * k, dtype=torch.int64) % k

    domains = num_domains if scenario == "continual" else 1
    shift_dirs = _unit_rows(torch.randn(domains, k, d, generator=gen, dtype=torch.float64))
    centres = _unit_rows(anchors.unsqueeze(0) + shift * shift_dirs + gap * gap_dir)  # [domains, K, d]

    labels = _label_sequence(scenario, n, k, gen, dirichlet_alpha, mean_run_length)
    domain_of = torch.div(torch.arange(n) * domains, n, rounding_mode="floor")
    eps = torch.randn(n, d, generator=gen, dtype=torch.float64)
    features = _unit_rows(centres[domain_of, labels] + noise * eps / math.sqrt(d))

    name = f"synthetic-{scenario}"
    return Benchmark(
        name=name,
        features=features.to(torch.float32),
        labels=labels,
        image_ids=[f"{name}/{seed}/{i:07d}" for i in range(n)],
        class_names=[f"class_{c:04d}" for c in range(k)],
        class_embeddings=class_embeddings.to(torch.float32),
        class_ids=class_ids,
    )
