"""The views vocabulary has one home (orchestrator.registry.views): one parser, one value object, and the two
choices that defer to an official protocol named apart: a sweep's 'protocol' (each method's, from its card) and
`bca cache`'s 'dataset' (each dataset's own)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from orchestrator import registry
from orchestrator.registry.views import DATASET_PROTOCOL, METHOD_PROTOCOL, ViewConfig, parse_views


@pytest.mark.parametrize("text,kind,views", [("single", "single", 1), ("augmix", "augmix", 64),
                                             ("crops31", "crops", 32), ("AugMix7", "augmix", 8)])
def test_one_parser_and_its_canonical_name(text, kind, views):
    parsed = parse_views(text)
    assert (parsed.kind, parsed.num_views) == (kind, views)
    assert parse_views(parsed.name) == parsed


@pytest.mark.parametrize("choice", [METHOD_PROTOCOL, DATASET_PROTOCOL])
def test_a_protocol_choice_is_not_a_views_value(choice):
    with pytest.raises(ValueError, match="each method's protocol in a sweep: 'protocol'; each dataset's own: "
                                         "'dataset'"):
        parse_views(choice)


def test_a_card_gives_its_official_protocol_as_a_value():
    assert registry.method_card("bca").protocol_views("imagenet-a") == parse_views("augmix")
    assert registry.method_card("bca").protocol_views("dtd") == ViewConfig("single")
    assert registry.method_card("mta").protocol_views("dtd").name == "crops"
    assert registry.method_card("dmn_zs").protocol_views("imagenet").name == "crops31"
    assert registry.method_card("boostadapter").protocol_views("imagenet").name == "single"
    assert registry.method_card("dota").protocol_views("dtd").name == "single"


def test_bca_cache_names_the_dataset_protocol_and_refuses_the_sweep_one(tmp_path):
    from orchestrator.cli import app

    args = ["cache", "--model", "ViT-B-16", "--dataset", "dtd", "--data-root", str(tmp_path), "--cache-dir",
            str(tmp_path), "--views"]
    out = CliRunner().invoke(app, [*args, METHOD_PROTOCOL])
    assert out.exit_code == 2, out.output
    assert "views 'protocol' is a choice to resolve first" in out.output and "Traceback" not in out.output
    out = CliRunner().invoke(app, [*args, "augmix0"])
    assert out.exit_code == 2 and "unknown views 'augmix0'" in out.output
