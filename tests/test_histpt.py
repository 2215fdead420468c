"""HisTPT: the float32 method against its per-sample reference (the official memory updates and pseudo-label,
reference.py) run in float64, on a stream where the memories act (their label differs from the current prompt's
and their weights differ) and a small memory turns over; its state carried along the stream."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.prompts import prompt_text
from orchestrator.clip.testing import TINY_VIT, register_tiny_models
from orchestrator.methods import make_method
from orchestrator.methods.histpt.reference import run_reference
from orchestrator.methods.prompt import PromptText

NAMES = ["dog", "cat", "golden retriever", "tabby_cat", "airplane"]
K = len(NAMES)
pytestmark = pytest.mark.usefixtures("one_thread")

DEFAULTS = {"lr": 5e-3, "steps": 1, "keep": 0.1, "logit_scale": 100.0, "memory_size": 32, "hard_top": 16,
            "ema_momentum": 0.99}


@pytest.fixture(scope="module")
def text():
    register_tiny_models()
    return prompt_text(load_backbone(TINY_VIT, None, "cpu"), NAMES)


@pytest.fixture(scope="module")
def stream(text):
    """Class embeddings at the initial context and 12 samples of 16 views near them (longer than a memory of 4)."""
    with torch.no_grad():
        emb = F.normalize(text.tower(text.tower.embed(text.tokens), text.tokens.argmax(-1)), dim=-1)
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, K, (12,), generator=g)
    return emb, F.normalize(torch.randn(12, 16, emb.shape[1], generator=g) + 3 * emb[labels][:, None], dim=-1)


@pytest.mark.parametrize("hp", [{}, {"memory_size": 4, "hard_top": 2, "ema_momentum": 0.5, "steps": 2}])
def test_histpt_equals_its_float64_reference_as_its_memories_label_the_stream(text, stream, hp):
    emb, views = stream
    post = make_method("histpt", emb, torch.arange(K), K, text=text, **hp).run(views).posteriors
    text64 = PromptText(copy.deepcopy(text.tower).double(), text.tokens, text.n_ctx)
    ref, log = run_reference(views.double(), text64, **{**DEFAULTS, **hp})
    ref32, _ = run_reference(views, text, **{**DEFAULTS, **hp})
    # The method is float32: it may be as far from the exact (float64) rows as a float32 transcription of the same
    # equations is, up to the order of its sums (4x), and no closer than a posterior's rounding, logit_scale times
    # a cosine's float32 eps.
    drift = (ref32.double() - ref).abs().max().item()
    tol = max(4 * drift, DEFAULTS["logit_scale"] * torch.finfo(torch.float32).eps)
    assert torch.equal(post.argmax(1), ref.argmax(1))
    assert (post.double() - ref).abs().max().item() <= tol
    # the memories act: their label is not the current prompt's on several samples, the three weights differ
    assert sum(entry["label"] != entry["current"] for entry in log) >= 2
    assert max(max(entry["weights"]) - min(entry["weights"]) for entry in log) > 0.02
    zero_shot = torch.softmax(100.0 * views[:, 0] @ emb.T, dim=-1)
    assert (post.argmax(1) != zero_shot.argmax(1)).sum() >= 2


def test_histpt_carries_its_prompt_and_memories_along_the_stream(text, stream):
    """A stream in two parts equals it at once (the context, AdamW's moments and the memories carried); the same
    samples in another order get other posteriors (no shards); the memories hold what its card counts."""
    emb, views = stream
    hp = {"memory_size": 4, "hard_top": 2}
    whole = make_method("histpt", emb, torch.arange(K), K, text=text, **hp)
    rows = whole.run(views).posteriors
    parts = make_method("histpt", emb, torch.arange(K), K, text=text, **hp)
    split = torch.cat([parts.run(views[:7]).posteriors, parts.run(views[7:]).posteriors])
    assert torch.equal(rows, split)
    backwards = make_method("histpt", emb, torch.arange(K), K, text=text, **hp).run(views.flip(0)).posteriors
    assert (rows - backwards.flip(0)).abs().max() > 1e-3
    assert whole.local.shape == whole.hard.shape == (4, K, emb.shape[1]) and whole.glob.shape == (K, emb.shape[1])
    # the memory turned over: its local and hard entries differ, and the global one is none of them
    assert not torch.equal(whole.local[0], whole.local[-1]) and not torch.equal(whole.hard[0], whole.hard[-1])
    assert all(not torch.equal(whole.glob, entry) for entry in (*whole.local, *whole.hard))
    assert whole.optimizer.state[whole.ctx]["step"] == len(views)


def test_histpt_refuses_a_hard_top_larger_than_its_memory(text, stream):
    emb, _ = stream
    with pytest.raises(ValueError, match=r"^histpt: hard_top \(5\) must be at most memory_size \(4\)"):
        make_method("histpt", emb, torch.arange(K), K, text=text, memory_size=4, hard_top=5)


def test_bca_compare_refuses_histpt_on_the_synthetic_suite_and_fields_it_on_real_datasets(tmp_path):
    """`bca compare histpt` on the synthetic presets (one generated feature a sample, no text tower) exits 2 saying
    what to do; on real datasets every comparison's field includes it."""
    from typer.testing import CliRunner

    from orchestrator import registry
    from orchestrator.cli import app
    from orchestrator.compare import suite_spec

    r = CliRunner().invoke(app, ["compare", "histpt", "--results", str(tmp_path / "results")],
                           env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 2, r.output
    assert "METHOD 'histpt' takes augmented views on every dataset" in " ".join(r.stderr.split())
    assert not (tmp_path / "results").exists()
    spec = suite_spec("bca", [], registry.method_names(), results_dir=tmp_path, data_root=tmp_path,
                      datasets=["dtd"], cache_dir=tmp_path / "cache")
    assert {"method": "histpt"} in spec["methods"]
