"""Every card's `views: protocol` on every benchmark dataset is what its official loader feeds it (the table in
tests/official_protocols.py), and a sweep's plan over real-layout datasets lists the feature-cache entries
those protocols need."""

from __future__ import annotations

import pytest

from orchestrator import registry
from orchestrator.registry.datasets import paper_datasets
from tests.official_protocols import DATASETS, OFFICIAL, missing_rows


def test_the_table_covers_the_fifteen_benchmark_datasets():
    assert sorted(DATASETS) == sorted(paper_datasets())
    for name, (_, views) in OFFICIAL.items():
        assert sorted(views) == sorted(DATASETS), name


def test_every_card_has_an_official_protocol_row():
    # the built-in cards (a plugin another test registered in this process has no official loader)
    def module(impl):
        return impl.partition(":")[0] if isinstance(impl, str) else impl.__module__

    builtin = [c.name for c in registry.method_cards() if module(c.impl).startswith("orchestrator.methods.")]
    problems = missing_rows(builtin)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("method", sorted(OFFICIAL))
def test_protocol_views_follow_the_official_loader(method):
    source, expected = OFFICIAL[method]
    card = registry.method_card(method)
    got = {dataset: card.protocol_views(dataset).name for dataset in DATASETS}
    assert got == expected, f"{method}: its card's protocol differs from its official loader ({source})"


def test_a_plan_over_real_layouts_lists_each_protocols_cache_entry(tmp_path):
    """`views: protocol` on ImageNet and DTD in their real layouts: the dry run lists one feature-cache entry per
    (dataset, views) the four methods' loaders need, crops for Zero everywhere, AugMix for DPE on ImageNet, AugMix
    for TPS and DMN-ZS on DTD."""
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    for name in ("imagenet", "dtd"):
        build_dataset(name, tmp_path / "data", num_classes=3, per_class=2)
    spec = {"name": "protocols", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "pretrained": "random",
                           "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
            "datasets": ["imagenet", "dtd"], "views": "protocol", "seeds": [1],
            "methods": [{"method": m} for m in ("zero", "dpe", "tps", "dmn_zs")]}
    path = tmp_path / "protocols.yaml"
    path.write_text(yaml.safe_dump(spec))
    done = CliRunner().invoke(app, ["sweep", str(path), "--dry-run"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert done.exit_code == 0, done.output
    entries = sorted(line.split(" views=")[0].split()[-1] + " " + line.split(" views=")[1].split()[0].rstrip(":")
                     for line in done.output.splitlines() if " views=" in line and line.endswith("to encode"))
    assert entries == ["dtd augmix", "dtd augmix31", "dtd crops", "dtd single",
                       "imagenet augmix", "imagenet crops", "imagenet crops31"]
    assert "feature-cache entries the trials read (7)" in done.output
