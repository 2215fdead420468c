"""The memory each card says its state takes (`state_words`, evaluated by `orchestrator.sweep.cost.state_bytes`: the
methods table's memory column and a GPU pack's memory plan) is what a real run of the method holds: the bytes of
every tensor its method object keeps after running a stream (what it carries from sample to sample; a step's
transient work arrays are not state), counted once per storage, the inputs (class embeddings, features) left out.

Every method that runs without CLIP's text tower is measured at a small shape; a few at the table's shape (K = 1000,
d = 512: BCA, TDA, OGA, DMN-ZS, ECALP, StatA; DOTA's 1 GB of covariances stays at the small shape); the
prompt-tuning methods (TPT, C-TPT, R-TPT, O-TPT, A-TPT, RLCF, DynaPrompt) on the tiny test backbones' text towers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.methods import make_method
from orchestrator.registry import method_card, method_cards
from orchestrator.sweep.cost import state_bytes

TABLE_SHAPE = (1000, 512)  # the methods table's K and d (docs/methods.md)
VIEWS = 8
# equal up to the rounding of a bool's quarter word
TOLERANCE = 0.001


# COSMIC's graphs hold as many cliques as the data make: its card counts them at an estimate (about one clique per
# node), which this leaves out of the comparison (the attributes holding them, the estimate's words at K and d = a).
DATA_SIZED = {"cosmic": (("clip_graph", "dino_graph"), lambda k, d: 2 * k * d + k * d)}


def held_bytes(method: object, inputs: list[torch.Tensor]) -> int:
    """Bytes of the tensors reachable from `method`'s attributes (through the project's objects, containers and
    optimisers), each storage once; the storages of `inputs` and of torch modules' weights are not its state."""
    skip = {t.untyped_storage().data_ptr() for t in inputs}
    seen: set[int] = set()
    visited: set[int] = set()
    total = 0
    stack: list[object] = [method]
    while stack:
        obj = stack.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in skip and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            stack.extend(obj.state.values())
        elif isinstance(obj, torch.nn.Module):
            continue  # a model's weights (the text tower) are the backbone's, not the method's state
        elif type(obj).__module__.startswith("orchestrator") and hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return total


def measure(name: str, num_classes: int, dim: int, n: int) -> tuple[int, int]:
    """(held bytes after a run of n samples at K = M = num_classes and d = dim, the card's state_bytes)."""
    card = method_card(name)
    g = torch.Generator().manual_seed(0)
    embeddings = F.normalize(torch.randn(num_classes, dim, generator=g), dim=1)
    ids = torch.arange(num_classes)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    shape = (n, VIEWS, dim) if card.takes_views else (n, dim)
    noise = torch.randn(*shape, generator=g)
    centre = embeddings[labels][:, None] if card.takes_views else embeddings[labels]
    features = F.normalize(noise + 3 * centre, dim=-1)
    kwargs = {"batch_size": card.batch_size} if card.batch_size else {}
    method = make_method(name, embeddings, ids, num_classes, **kwargs)
    # an auxiliary encoder's features: the original view's (width a = d)
    auxiliary = {a: features[:, 0].contiguous() for a in card.auxiliary} or None
    method.run(features, auxiliary) if auxiliary else method.run(features)
    held = held_bytes(method, [embeddings, ids, features, *(auxiliary or {}).values()])
    stated = state_bytes(name, num_classes, dim, n)
    if name in DATA_SIZED:  # its graphs' share is the card's estimate: the rest must be exact
        graphs = sum(t.untyped_storage().nbytes() for g in DATA_SIZED[name][0] for part in getattr(method, g)
                     for t in (part if isinstance(part, list) else [part]))
        held -= graphs
        stated -= 4 * DATA_SIZED[name][1](num_classes, dim)
    return held, stated


def test_every_method_states_its_memory():
    # (a method adapting the image encoder holds the tower's adapted parameters and their optimiser state, which K
    # and d do not give: the methods table says so, and its memory plan is per image, `ImageEncoderUse.mb_per_image`)
    builtin = [c for c in method_cards() if str(c.impl).startswith("orchestrator.methods.") and not c.image_encoder]
    assert len(builtin) > 20 and [c.name for c in builtin if c.cost.state_words is None] == []


# ECALP's buffers start at 64 rows and double: at n = 64 (and 128, 256, ...) they hold exactly n
@pytest.mark.parametrize("name", [c.name for c in method_cards() if c.text_encoder is None and c.image_encoder is None])
def test_the_cards_state_memory_is_what_a_run_holds(name):
    held, stated = measure(name, 20, 32, 64)
    assert abs(held - stated) <= TOLERANCE * max(held, 1), (name, held, stated)


@pytest.mark.parametrize(("name", "n"), [("bca", 256), ("tda", 256), ("oga", 256), ("dmn_zs", 64), ("ecalp", 64),
                                         ("stata", 128)])
def test_at_the_tables_shape(name, n):
    held, stated = measure(name, *TABLE_SHAPE, n)
    assert abs(held - stated) <= TOLERANCE * held, (name, held, stated)


@pytest.mark.parametrize(("words", "needle"), [("K*shots", "'shots'"), ("K**2", "'K ** 2'"), ("K*(d", "not an arithmetic"),
                                              ("__import__('os')", "__import__")])
def test_a_state_expression_other_than_arithmetic_on_its_names_is_refused(words, needle):
    from orchestrator.registry import HParam, MethodCard
    from orchestrator.registry.card import Cost

    with pytest.raises(ValueError, match="state_words") as refused:
        MethodCard("toy", "Toy", 1, "x", "", "m:C", (HParam("shot", "int", 3, "cache size", "size", low=1),),
                   cost=Cost(state_words=words))
    assert needle in str(refused.value)
    card = MethodCard("toy", "Toy", 1, "x", "", "m:C", (HParam("shot", "int", 3, "cache size", "size", low=1),),
                      cost=Cost(state_words="K*shot*d + K/4"))
    assert card.state_bytes(10, 4) == 4 * (10 * 3 * 4 + 2.5)


@pytest.mark.parametrize("model", ["bca-tiny-vit", "bca-tiny-rn"])
def test_the_prompt_tuning_state_is_what_a_run_holds(model):
    """TPT, C-TPT, R-TPT, O-TPT, A-TPT, RLCF, DynaPrompt and HisTPT on the tiny test backbones' text towers (token
    width w = 128, d = 64): the prompts' token embeddings, the initial text features, DynaPrompt's buffer of contexts
    and HisTPT's context, AdamW moments and memories their cards count."""
    from orchestrator.clip.backbone import load_backbone
    from orchestrator.clip.prompts import prompt_text
    from orchestrator.clip.testing import TINY_RN, TINY_VIT, register_tiny_models
    from orchestrator.methods.prompt import TEACHER_CLASSES, TEACHER_VIEWS

    assert model in (TINY_VIT, TINY_RN)
    register_tiny_models()
    text = prompt_text(load_backbone(model, None, "cpu"), ["dog", "cat", "golden retriever", "tabby_cat", "airplane"])
    with torch.no_grad():
        embedded = text.tower.embed(text.tokens)
        embeddings = F.normalize(text.tower(embedded, text.tokens.argmax(-1)), dim=-1)
    (num_classes, dim), width = embeddings.shape, embedded.shape[-1]
    # 10 views: the fewest whose int(V * keep) selects one at keep 0.1 (fewer are refused)
    views = F.normalize(torch.randn(4, 10, dim, generator=torch.Generator().manual_seed(0)), dim=-1)
    for name in ("tpt", "ctpt", "rtpt", "otpt", "atpt", "dynaprompt", "histpt", "rlcf"):
        ids = torch.arange(num_classes)
        method = make_method(name, embeddings, ids, num_classes, text=text)
        # RLCF's teacher (here the student's own features) is the trial's, not the method's state
        method.run(views, {TEACHER_VIEWS: views, TEACHER_CLASSES: embeddings} if name == "rlcf" else None)
        held = held_bytes(method, [embeddings, ids, views, text.tokens])
        stated = method_card(name).state_bytes(num_classes, dim, text_width=width)
        assert abs(held - stated) <= TOLERANCE * held, (name, held, stated)
