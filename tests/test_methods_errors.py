"""Every bad input to the methods API raises a ValueError that names the problem."""

from __future__ import annotations

import re

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.registry import method_card, method_names

K, D = 3, 4
EMB = torch.nn.functional.normalize(torch.randn(K, D, generator=torch.Generator().manual_seed(0)), dim=1)
IDS = torch.arange(K)
FEATS = torch.nn.functional.normalize(torch.randn(5, D, generator=torch.Generator().manual_seed(1)), dim=1)


def raises(match: str):
    return pytest.raises(ValueError, match=match)


def test_unknown_method_lists_the_valid_ones():
    with raises(re.escape("unknown method 'bcaa'; valid methods: " + ", ".join(method_names()))):
        run_stream("bcaa", FEATS, EMB, IDS, K)
    with raises("unknown method 'nope'"):
        method_card("nope")


def test_unknown_hparam_names_it_and_lists_the_valid_ones():
    with raises(r"unknown hparam 'n3' for method 'bca'; valid hparams: \[.*'n1', 'n2'.*'tau_prior'"):
        run_stream("bca", FEATS, EMB, IDS, K, n3=1)
    with raises("unknown hparam 'n1' for method 'pa'"):       # pa's U never adapts: n1 does not apply
        make_method("pa", EMB, IDS, K, n1=5)
    with raises("unknown hparam 'tau' for method 'clip'"):
        make_method("clip", EMB, IDS, K, tau=0.3)


# The prompt-tuning methods need a text tower besides the features: tests/test_tpt.py runs them at their defaults
# and on an empty stream; the image-encoder methods take images (tests/test_encoder_methods.py).
WITHOUT_TEXT = [m for m in method_names()
                if method_card(m).text_encoder is None and method_card(m).image_encoder is None]


@pytest.mark.parametrize("method", WITHOUT_TEXT)
def test_every_default_is_valid(method):
    feats = FEATS[:, None] if method_card(method).takes_views else FEATS
    assert run_on_features(method, feats, **method_card(method).defaults()).shape == (5, K)


def run_on_features(method: str, feats: torch.Tensor, **hparams) -> torch.Tensor:
    """Its posteriors on the features; CLIP's original views stand in for an auxiliary encoder's where it reads one."""
    auxiliary = {a: feats if feats.ndim == 2 else feats[:, 0] for a in method_card(method).auxiliary}
    return make_method(method, EMB, IDS, K, **hparams).run(feats, auxiliary or None).posteriors


@pytest.mark.parametrize("features,match", [
    ([[1.0, 0.0, 0.0, 0.0]], "features must be a torch.Tensor"),
    (FEATS.double(), "features must be float32, got torch.float64"),
    (FEATS[0], r"features must have shape \[n, d\] or \[n, V, d\] .*, got \(4,\)$"),
    (FEATS[:, None, None], r"bca: features must have shape \[n, d\] or \[n, V, d\] \(augmented views, view 0 "
                           r"the original\), got \(5, 1, 1, 4\)$"),
    (FEATS[:, :3], "features have dimension 3 but class_embeddings have 4"),
    (torch.cat([FEATS, torch.full((1, D), float("nan"))]), "non-finite values.*first at sample 5"),
    (torch.cat([FEATS, torch.tensor([[float("inf"), 0.0, 0.0, 0.0]])]), "non-finite values"),
    (torch.cat([FEATS, torch.zeros(1, D)]), "feature of sample 5 has zero norm"),
    (torch.cat([FEATS, torch.full((1, D), 1e30)]), "feature of sample 5 has a norm beyond float32.s range"),
    (FEATS.to("meta"), "features are on meta but class_embeddings on cpu"),
])
def test_bad_features(features, match):
    with raises(match):
        run_stream("bca", features, EMB, IDS, K)


def test_view_methods_need_a_view_axis():
    with raises(r"zero: features must have shape \[n, V, d\].*features\[:, None\]"):
        run_stream("zero", FEATS, EMB, IDS, K)
    with raises("zero: features need at least one view"):
        run_stream("zero", FEATS[:, None][:, :0], EMB, IDS, K)


@pytest.mark.parametrize("emb,match", [
    (EMB.numpy(), r"class_embeddings must be a torch.Tensor \[M, d\]"),
    (EMB.double(), "class_embeddings must be float32"),
    (EMB[0], r"class_embeddings must have shape \[M, d\]"),
    (EMB[:0], r"class_embeddings must have shape \[M, d\] with M, d >= 1"),
    (torch.cat([EMB[:2], torch.full((1, D), float("nan"))]), "class_embeddings contain non-finite values"),
])
def test_bad_class_embeddings(emb, match):
    with raises(match):
        run_stream("clip", FEATS, emb, IDS, K)


@pytest.mark.parametrize("ids,match", [
    ([0, 1, 2], "class_ids must be a torch.Tensor"),
    (IDS.int(), "class_ids must be int64, got torch.int32"),
    (torch.arange(2), r"class_ids must have shape \[M\] = \[3\]"),
    (torch.tensor([0, 1, 3]), r"class_ids must lie in \[0, num_classes\) = \[0, 3\), found 3"),
    (torch.tensor([-1, 1, 2]), "found -1"),
    (torch.tensor([0, 1, 1]), r"every class needs at least one class embedding; classes without one: \[2\]"),
    (IDS.to("meta"), "class_ids are on meta but class_embeddings on cpu"),
])
def test_bad_class_ids(ids, match):
    with raises(match):
        run_stream("clip", FEATS, EMB, ids, K)


@pytest.mark.parametrize("num_classes", [1, 3.0, True, "3"])
def test_bad_num_classes(num_classes):
    with raises("num_classes must be an integer >= 2"):
        run_stream("clip", FEATS, EMB, IDS, num_classes)


@pytest.mark.parametrize("method,hparams,match", [
    ("bca", {"tau": -0.1}, r"bca: hparam 'tau' must be a number in \[0, 1\] \(confidence gate of the updates: a probability"),
    ("bca", {"tau": float("nan")}, "hparam 'tau' must be a number"),
    ("bca", {"tau": "0.3"}, "hparam 'tau' must be a number"),
    ("bca", {"tau": True}, "hparam 'tau' must be a number"),
    ("bca", {"tau_likelihood": -1}, "hparam 'tau_likelihood' must be a number"),
    ("pa", {"tau_prior": "high"}, "pa: hparam 'tau_prior' must be a number"),
    ("bca", {"n1": -1}, r"hparam 'n1' must be an integer >= 0 \(initial count of the class embeddings' running means"),
    ("la", {"n1": float("inf")}, "hparam 'n1' must be an integer"),
    ("bca", {"n1": 2.5}, "hparam 'n1' must be an integer >= 0"),
    ("bca", {"tau": 1.5}, r"hparam 'tau' must be a number in \[0, 1\]"),
    ("pa", {"n2": None}, "hparam 'n2' must be an integer"),
    ("clip", {"logit_scale": 0}, r"clip: hparam 'logit_scale' must be a number > 0"),
    ("bca", {"select_on": "prior"}, r"hparam 'select_on' must be one of \['likelihood', 'posterior'\]"),
    ("bca", {"update": "ema"}, r"hparam 'update' must be one of \['count', 'momentum', 'decay'\]"),
    ("bca", {"decay": 0.0}, r"hparam 'decay' must be a number in \(0, 1\]"),
    ("bca", {"decay": 1.5}, "hparam 'decay' must be a number"),
    ("bca", {"state_dtype": "bfloat16"}, r"hparam 'state_dtype' must be one of \['float32', 'float16'\]"),
    ("tda", {"pos_shot": 0}, r"tda: hparam 'pos_shot' must be an integer >= 1 \(positive cache entries per class "
                             r"\(at least 1: the official code keeps one even at 0"),
    ("tda", {"neg_shot": 2.5}, "hparam 'neg_shot' must be an integer >= 1"),
    ("tda", {"pos_alpha": -1.0}, "hparam 'pos_alpha' must be a number"),
    ("tda", {"neg_beta": float("inf")}, "hparam 'neg_beta' must be a number"),
    ("tda_pa", {"tau": -0.5}, "tda_pa: hparam 'tau' must be a number"),
    ("tda_pa", {"n2": -2}, "hparam 'n2' must be an integer"),
    ("zero", {"keep": 0.0}, r"zero: hparam 'keep' must be a number in \(0, 1\] \(fraction of the views kept"),
    ("zero", {"keep": 2}, "hparam 'keep' must be a number"),
])
def test_bad_hparams(method, hparams, match):
    with raises(match):
        make_method(method, EMB, IDS, K, **hparams)


@pytest.mark.parametrize("method", ["la", "pa", "bca"])
def test_select_on_posterior_needs_one_embedding_per_class(method):
    emb = torch.cat([EMB, EMB])
    ids = torch.arange(2 * K) % K
    with raises(r"select_on='posterior' selects a class, so it needs exactly one class embedding per class "
                r"\(M == K\); got M=6, K=3"):
        make_method(method, emb, ids, K, select_on="posterior")
    make_method(method, emb, ids, K, select_on="likelihood")


@pytest.mark.parametrize("method", WITHOUT_TEXT)
def test_an_empty_stream_is_not_an_error(method):
    feats = FEATS[:0, None] if method_card(method).takes_views else FEATS[:0]
    assert run_on_features(method, feats).shape == (0, K)
