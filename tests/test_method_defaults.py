"""Defaults live on the cards only, and a derived default is resolved once, at the edge, before a run_id is hashed.

- the shipped specs (experiments/*.yaml) expand to the run_ids pinned in tests/data/shipped_run_ids.json: a
  refactor of the methods, cards or plan that changes a run_id (a new run where a result already exists) fails
  here. The pinned ids are those after tau_likelihood / tau_prior null = tau was resolved at the edge (the one
  deliberate change, issue 25: every la / pa / bca run that left them null took a new run_id once);
- a null gate and the explicit equal value are one run (one run_id, the value stored);
- the BCA family's config has no defaults of its own: each value is its card's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from orchestrator import registry
from orchestrator.clip.testing import build_all
from orchestrator.results.schema import config_hash
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand

REPO = Path(__file__).resolve().parents[1]
PINNED = Path(__file__).with_name("data") / "shipped_run_ids.json"


def shipped_run_ids(data_root: Path) -> dict[str, list[str]]:
    """Every shipped spec's run_ids in expansion order (its data_root replaced by a fake one with every dataset)."""
    build_all(data_root)
    out = {}
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "data_root" in data:
            data["data_root"] = str(data_root)
        out[path.name] = [run.run_id for run in expand(validate_spec(data, source=str(path), base_dir=path.parent))]
    return out


def pin(run_ids: list[str]) -> dict[str, object]:
    """A spec's run_ids as pinned: their count and the sha256 of the list in order (the study spec has 10^4+)."""
    return {"runs": len(run_ids), "sha256": hashlib.sha256("\n".join(run_ids).encode()).hexdigest()}


@pytest.mark.timeout(600)
def test_the_shipped_specs_keep_their_run_ids(tmp_path):
    """BCA_PINS_REFRESH=1 re-pins them (a deliberate change: the commit says which runs changed and why)."""
    got = {spec: pin(run_ids) for spec, run_ids in shipped_run_ids(tmp_path / "data").items()}
    if os.environ.get("BCA_PINS_REFRESH"):
        PINNED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    pinned = json.loads(PINNED.read_text())
    assert sorted(got) == sorted(pinned)
    for spec, now in got.items():
        assert now == pinned[spec], f"{spec}: run_ids changed ({pinned[spec]['runs']} pinned, {now['runs']} now)"


SPEC = {
    "name": "gates", "results_dir": "results",
    "datasets": [{"synthetic": "label_shift", "n": 50, "num_classes": 3, "dim": 8}],
    "seeds": [1], "resources": {"cpus": 1},
}


def _runs(tmp_path, methods):
    return expand(validate_spec({**copy.deepcopy(SPEC), "methods": methods}, base_dir=tmp_path))


def test_a_null_gate_and_the_equal_explicit_value_are_one_run(tmp_path):
    null = _runs(tmp_path, [{"method": "bca", "tau": 0.4}])
    explicit = _runs(tmp_path, [{"method": "bca", "tau": 0.4, "tau_likelihood": 0.4, "tau_prior": [None, 0.4]}])
    assert [r.run_id for r in null] == [r.run_id for r in explicit]
    assert null[0].hparams["tau_likelihood"] == null[0].hparams["tau_prior"] == 0.4
    assert config_hash(null[0].config) == null[0].run_id


def test_a_null_gate_follows_each_value_of_a_grid_over_tau(tmp_path):
    runs = _runs(tmp_path, [{"method": "la", "tau": [0.2, 0.5], "tau_likelihood": [None, 0.5]}])
    got = sorted((r.hparams["tau"], r.hparams["tau_likelihood"]) for r in runs)
    assert got == [(0.2, 0.2), (0.2, 0.5), (0.5, 0.5)]  # (0.5, null) is (0.5, 0.5)
    assert len({r.run_id for r in runs}) == 3


def test_the_card_resolves_a_null_gate_for_the_method_api():
    card = registry.method_card("bca")
    assert card.resolve({"tau": 0.45})["tau_likelihood"] == 0.45
    assert card.resolve({"tau": 0.45, "tau_prior": 0.1})["tau_prior"] == 0.1
    assert card.resolve({}, "dtd")["tau_prior"] == 0.35  # the per-dataset tau, then the gate


def test_the_bca_config_takes_every_value_from_a_card():
    import torch

    from orchestrator.methods import make_method

    emb = torch.nn.functional.normalize(torch.randn(4, 8), dim=1)
    ids = torch.arange(4)
    family = registry.method_card("bca").resolve({})
    for name in ("clip", "la", "pa", "bca"):
        card = registry.method_card(name)
        config = make_method(name, emb, ids, 4).config
        for key in ("tau_likelihood", "tau_prior", "n1", "n2", "logit_scale", "select_on", "update", "decay",
                    "state_dtype"):
            own = card.resolve({}).get(key, family[key])  # a part the variant does not adapt: the family card's
            assert getattr(config, key) == own, (name, key)
    assert make_method("la", emb, ids, 4, n1=77).config.n1 == 77


def test_a_gate_that_follows_tau_adds_nothing_to_a_label():
    import pandas as pd

    from orchestrator.results import report

    runs = pd.DataFrame({"backbone": "b", "method": "bca", "dataset": "d", "tau": [0.2, 0.5, 0.5],
                         "tau_likelihood": [0.2, 0.5, 0.5], "tau_prior": [0.2, 0.5, 0.1]})
    labels = report.row_labels(runs, ["tau", "tau_likelihood", "tau_prior"])
    assert list(labels) == ["BCA (tau=0.2, tau_prior=0.2)", "BCA (tau=0.5, tau_prior=0.5)",
                            "BCA (tau=0.5, tau_prior=0.1)"]
    assert list(report.row_labels(runs[:2], ["tau", "tau_likelihood", "tau_prior"])) == ["BCA (tau=0.2)",
                                                                                         "BCA (tau=0.5)"]


def _real_runs(tmp_path, extra):
    build_all(tmp_path / "data")
    spec = {"name": "prompts", "results_dir": "results", "cache_dir": "cache", "data_root": "data", "datasets": ["dtd"],
            "backbones": [{"model": "RN50", "pretrained": "openai"}], "seeds": [1],
            "methods": [{"method": "clip"}, {"method": "mta"}], **extra}
    return sorted((r.method, r.config["templates"]) for r in expand(validate_spec(spec, base_dir=tmp_path)))


def test_the_default_templates_are_each_methods_official_set(tmp_path):
    # MTA's official run embeds the single prompt "a photo of a {}." (its card's templates: tpt1); a method whose
    # card names none embeds the dataset's own templates; each run records the set it used.
    assert registry.method_card("mta").templates == "tpt1"
    assert _real_runs(tmp_path, {}) == [("clip", "dataset"), ("mta", "tpt1")]
    assert _real_runs(tmp_path, {"templates": "protocol"}) == [("clip", "dataset"), ("mta", "tpt1")]
    # a set the spec names is every method's
    assert _real_runs(tmp_path, {"templates": "dataset"}) == [("clip", "dataset"), ("mta", "dataset")]
    assert _real_runs(tmp_path, {"templates": ["protocol", "dataset"]}) == [
        ("clip", "dataset"), ("mta", "dataset"), ("mta", "tpt1")]


def test_a_card_naming_an_unknown_template_set_is_refused():
    with pytest.raises(ValueError, match="templates must be one of"):
        registry.MethodCard("toy", "Toy", 1, "toy", "nothing", "x:y", templates="nope")
