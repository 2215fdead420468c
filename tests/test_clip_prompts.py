"""Template sets and class embeddings (normalisation, ensembling, M = K*t layout, text cache)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import orchestrator.clip.prompts as prompts
from orchestrator.clip import BackboneSpec, class_embeddings, load_backbone, resolve_templates
from orchestrator.clip.testing import TINY_VIT, build_dataset, register_tiny_models
from orchestrator.registry import paper_datasets

CLASSES = ["cat", "dog", "school bus"]


@pytest.fixture(scope="module")
def backbone():
    register_tiny_models()
    return load_backbone(TINY_VIT, None, device="cpu")


def test_named_sets_come_from_open_clip():
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

    seven = resolve_templates("ensemble7")
    eighty = resolve_templates("clip80")
    assert len(seven.templates) == 7 and seven.ensemble
    assert len(eighty.templates) == 80 and eighty.ensemble
    assert seven.templates[0] == SIMPLE_IMAGENET_TEMPLATES[0]("{}") == "itap of a {}."
    assert [t.replace("{}", "x") for t in eighty.templates] == [f("x") for f in OPENAI_IMAGENET_TEMPLATES]


def test_dataset_templates_follow_the_public_protocol():
    expected = {"imagenet": 7, "imagenet-a": 7, "imagenet-v2": 7, "caltech101": 7, "cars": 7, "sun397": 7,
                "imagenet-r": 80, "imagenet-sketch": 80}
    for name in paper_datasets():
        tset = resolve_templates("dataset", dataset=name)
        assert len(tset.templates) == expected.get(name, 1), name
    assert resolve_templates("dataset", dataset="dtd").templates == ("{} texture.",)
    assert resolve_templates("dataset", dataset="eurosat").templates == ("a centered satellite photo of {}.",)
    assert resolve_templates("dataset", dataset="pets").templates == ("a photo of a {}, a type of pet.",)
    assert resolve_templates("dataset", dataset="ucf101").templates == ("a photo of a person doing {}.",)


def test_tpt1_is_the_single_prompt_of_tpt_derived_code():
    # MTA's official runs: CoOp's prompt learner with ctx_init "a_photo_of_a" joins it, the class name and "."
    assert resolve_templates("tpt1").templates == ("a photo of a {}.",)


def test_handcrafted_sets_grow_one_template_at_a_time():
    assert resolve_templates("handcrafted1").templates == ("a photo of a {}",)
    four = resolve_templates("handcrafted4")
    assert four.templates == ("a photo of a {}", "a origami {}", "art of the {}", "itap of a {}")
    assert not four.ensemble


def test_template_errors():
    with pytest.raises(ValueError, match="needs the dataset name"):
        resolve_templates("dataset")
    with pytest.raises(ValueError, match="unknown template set 'handcrafted5'"):
        resolve_templates("handcrafted5")
    with pytest.raises(ValueError, match="exactly one"):
        resolve_templates(["no slot here"])


def test_ensemble_is_normalise_average_normalise(backbone):
    templates = ["a photo of a {}.", "art of the {}."]
    emb, ids = class_embeddings(backbone, CLASSES, templates)
    assert emb.shape == (3, 64) and emb.dtype == torch.float32
    assert ids.tolist() == [0, 1, 2]
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3))
    for k, name in enumerate(CLASSES):
        per_prompt = backbone.encode_texts([t.replace("{}", name) for t in templates])
        torch.testing.assert_close(per_prompt.norm(dim=-1), torch.ones(2))
        torch.testing.assert_close(emb[k], F.normalize(per_prompt.mean(0), dim=0), atol=1e-5, rtol=1e-5)


def test_handcrafted_layout_is_template_major(backbone):
    emb, ids = class_embeddings(backbone, CLASSES, "handcrafted3")
    K = len(CLASSES)
    assert emb.shape == (3 * K, 64)
    assert ids.tolist() == [m % K for m in range(3 * K)]
    torch.testing.assert_close(emb.norm(dim=-1), torch.ones(3 * K))
    # row m is template m // K for class m % K
    torch.testing.assert_close(emb[K + 2], backbone.encode_texts(["a origami school bus"])[0], atol=1e-5, rtol=1e-5)


def test_text_cache_hit_loads_no_model(tmp_path, backbone, monkeypatch):
    register_tiny_models()
    spec = BackboneSpec(TINY_VIT, None)
    first, ids = class_embeddings(spec, CLASSES, "dataset", dataset="dtd", cache_dir=tmp_path, device="cpu")
    assert len(list((tmp_path / "text").glob("*.npz"))) == 1

    def refuse(*args, **kwargs):
        raise AssertionError("cache hit loaded a model")

    monkeypatch.setattr(prompts, "shared_backbone", refuse)
    again, ids_again = class_embeddings(spec, CLASSES, "dataset", dataset="dtd", cache_dir=tmp_path, device="cpu")
    torch.testing.assert_close(again, first)
    assert ids_again.tolist() == ids.tolist()
    # a loaded backbone with the same identity hits the same entry
    torch.testing.assert_close(class_embeddings(backbone, CLASSES, ["{} texture."], cache_dir=tmp_path)[0], first)
    # other prompts miss
    with pytest.raises(AssertionError, match="loaded a model"):
        class_embeddings(spec, CLASSES, "handcrafted2", cache_dir=tmp_path, device="cpu")


def test_cupl_prompts_are_ensembled_with_the_dataset_templates(backbone, tmp_path):
    """DPE's class prototypes: each class's templates and CuPL descriptions, each normalised, averaged."""
    path = prompts.cupl_file(tmp_path, "dtd")
    assert path == tmp_path / "prompts" / "cupl" / "CuPL_prompts_dtd.json"
    path.parent.mkdir(parents=True)
    cupl = {"cat": ["a cat curled up.", "a furry cat."], "dog": ["a dog running."], "school_bus": ["a yellow bus."]}
    path.write_text(json.dumps(cupl))
    emb, ids = class_embeddings(backbone, CLASSES, "cupl", dataset="dtd", data_root=tmp_path)
    assert ids.tolist() == [0, 1, 2]
    for k, name in enumerate(CLASSES):
        texts = [f"{name} texture.", *cupl[name.replace(" ", "_")]]
        expected = F.normalize(F.normalize(backbone.encode_texts(texts), dim=-1).mean(dim=0), dim=0)
        torch.testing.assert_close(emb[k], expected, atol=1e-5, rtol=0)
    cupl.pop("dog")
    path.write_text(json.dumps(cupl))
    with pytest.raises(ValueError, match=r"no prompts for classes \['dog'\]"):
        class_embeddings(backbone, CLASSES, "cupl", dataset="dtd", data_root=tmp_path)


def test_cupl_without_its_file_is_a_clear_error_and_the_plan_falls_back_saying_so(tmp_path):
    from orchestrator.sweep.load import validate_spec
    from orchestrator.sweep.plan import expand, template_notes

    with pytest.raises(ValueError, match=r"CuPL_prompts_oxfordpets.json does not exist"):
        resolve_templates("cupl", dataset="pets", data_root=tmp_path)
    build_dataset("pets", tmp_path / "data", num_classes=2, per_class=2)
    spec = validate_spec({"name": "c", "results_dir": "r", "cache_dir": "c", "data_root": "data",
                          "backbones": [{"model": "RN50", "pretrained": "openai"}], "datasets": ["pets"],
                          "templates": ["cupl"], "methods": [{"method": "clip"}], "seeds": [1]}, base_dir=tmp_path)
    assert [r.config["templates"] for r in expand(spec)] == ["dataset"]
    assert "CuPL_prompts_oxfordpets.json is absent" in template_notes(spec)[0]
