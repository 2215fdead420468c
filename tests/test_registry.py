"""The registries: one card per method and per dataset, and everything else knows them only through the cards.

- a method registered from a plugin module of its own runs through spec validation, a Ray sweep trial, the
  results views, the report and the dashboard's labels and filters with no other file touched;
- no method name, method label or dataset alias is spelled in the package outside the registry;
- the plain-data registries import without torch (how modules import each other: test_imports.py).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import registry
from plugin_sources import SHARPEN as PLUGIN

REPO = Path(__file__).resolve().parents[1]
BCA = str(Path(sys.executable).with_name("bca"))


SPEC = {
    "name": "plugin", "results_dir": "results", "plugins": ["toy_plugin"],
    "datasets": [{"synthetic": "label_shift", "n": 300, "num_classes": 5, "dim": 16}],
    "methods": [{"method": "clip"}, {"method": "sharpen", "scale": [10, 100]}],
    "seeds": [1], "resources": {"cpus": 1},
}

READ_BACK = '''
import json, sys
from orchestrator import registry
from orchestrator.results.db import ResultsDB
from orchestrator.results import report
from dashboard import queries

db = ResultsDB(sys.argv[1])
runs = queries.accuracy_runs(db)
hparams = queries.hparam_columns(db)
table = report.method_dataset_table(db).to_frame()
print(json.dumps({
    "card": registry.method_card("sharpen").label,
    "scale_type": db.sql("SELECT scale FROM runs").schema.field("scale").type.__str__(),
    "extra": db.extra_run_columns,
    "accuracy": {f"{m}:{s}": a for m, s, a in zip(runs["method"], runs["scale"].fillna(-1), runs["accuracy"])},
    "rows": [str(i[1]) for i in table.index],
    "labels": sorted(set(queries.series_labels(runs, hparams))),
    "filters": queries.filter_columns(runs, hparams),
    "options": queries.filter_options(runs, ["scale"]),
}))
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_plugin_method_is_first_class_everywhere(tmp_path):
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "toy_plugin.py").write_text(PLUGIN)
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(SPEC))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugin"), str(REPO)])}
    env.pop("BCA_PLUGINS", None)
    sweep = subprocess.run([BCA, "sweep", str(spec)], env=env, capture_output=True, text=True, timeout=280)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert "Sharpened CLIP (scale=10)" in sweep.stdout  # the end-of-sweep table labels it from its card
    read = subprocess.run([sys.executable, "-c", READ_BACK, str(tmp_path / "results")],
                          env={**env, "BCA_PLUGINS": "toy_plugin"}, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    got = json.loads(read.stdout)
    assert got["card"] == "Sharpened CLIP"
    assert got["scale_type"] == "double" and got["extra"] == []  # a typed column from the card, not a guess
    # scale 100 is CLIP's own logit scale: the same predictions on the same stream
    assert got["accuracy"]["sharpen:100.0"] == got["accuracy"]["clip:-1.0"]
    assert {"Sharpened CLIP (scale=10)", "Sharpened CLIP (scale=100)"} <= set(got["rows"])
    assert {"Sharpened CLIP (scale=10)", "Sharpened CLIP (scale=100)"} <= set(got["labels"])
    assert got["filters"]["scale"] == "scale" and got["options"]["scale"] == [10.0, 100.0]


def test_a_plugin_that_cannot_be_imported_is_a_spec_error(tmp_path):
    from orchestrator.sweep.load import SpecError, validate_spec

    with pytest.raises(SpecError, match=r"plugins: plugin module 'no_such_plugin' cannot be imported"):
        validate_spec({**SPEC, "plugins": ["no_such_plugin"]}, base_dir=tmp_path)


def test_cards_refuse_what_would_break_a_results_column():
    card = registry.method_card("bca")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_method(registry.MethodCard("bca", "Other", 1, "x", "", "m:C"))
    with pytest.raises(ValueError, match=r"hparam 'tau' is int, but another method declares it float"):
        registry.register_method(registry.MethodCard(
            "clash", "Clash", 1, "x", "", "m:C", (registry.HParam("tau", "int", 1, "a gate", "threshold"),)))
    assert registry.method_card("bca") is card and registry.find_method("clash") is None


@pytest.mark.parametrize(("make", "message"), [
    (lambda c: c.Views("rotations"), "views kind must be one of"),
    (lambda c: c.Views("augmix", count=0), "views count must be an integer >= 1, got 0"),
    (lambda c: c.Views(scope="some"), "views scope must be 'all' or 'protocol', got 'some'"),
    (lambda c: c.Views(groups={"ood": "zoom"}), "views groups maps a dataset group"),
    (lambda c: c.Views(datasets={"nowhere": "augmix"}), "views datasets maps a registered dataset"),
    (lambda c: c.Views(single_datasets=("nowhere",)), "views single_datasets names registered datasets, got 'nowhere'"),
    (lambda c: c.Cost(samples_per_s=0), "cost samples_per_s must be a number > 0 or None, got 0"),
    (lambda c: c.Lockstep("m:f", inputs="pairs"), "lockstep inputs must be one of"),
    (lambda c: c.SigmoidRule("refuse"), "sigmoid rule 'refuse' needs a why"),
    # a card takes each record whole: a flat value where a record belongs is named
    (lambda c: c.MethodCard("toy", "Toy", 1, "x", "", "m:C", views="augmix"),
     "method 'toy': views must be a Views, got 'augmix'"),
    (lambda c: c.MethodCard("toy", "Toy", 1, "x", "", "m:C", prior=True),
     "method 'toy': prior must be a Prior or None, got True"),
    (lambda c: c.MethodCard("toy", "Toy", 1, "x", "", "m:C", prior=c.Prior(count="n2")),
     "method 'toy': prior count 'n2' is not one of its hparams"),
    (lambda c: c.MethodCard("toy", "Toy", 1, "x", "", "m:C", views=c.Views(when={"x": (1,)})),
     "method 'toy': views when needs inputs 'either' and its own hparams"),
])
def test_a_cards_records_refuse_bad_values_by_name(make, message):
    from orchestrator.registry import card

    with pytest.raises(ValueError, match=re.escape(message)):
        make(card)


def test_a_card_reads_its_records():
    card = registry.method_card("cosmic")
    assert (card.views.kind, card.views.count, dict(card.views.groups)) == ("augmix", 8, {"ood": "crops"})
    assert card.cost.state_words is not None and card.prior is None and card.lockstep is None
    assert registry.method_card("bca").prior.count == "n2" and registry.method_card("bca").lockstep.inputs is None
    assert registry.method_card("transclip").views.single_datasets == (
        "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch")


def test_one_range_for_the_spec_and_the_methods(tmp_path):
    """The sweep refuses exactly what run_stream refuses: both ask the card."""
    import torch

    from orchestrator.methods import run_stream
    from orchestrator.sweep.load import SpecError, validate_spec

    feats = torch.nn.functional.normalize(torch.randn(4, 8), dim=1)
    emb = torch.nn.functional.normalize(torch.randn(3, 8), dim=1)
    for hp in ({"n1": 2.5}, {"tau": 1.5}, {"n2": -1}):
        with pytest.raises(ValueError, match="must be"):
            run_stream("bca", feats, emb, torch.arange(3), 3, **hp)
        spec = {**SPEC, "plugins": [], "methods": [{"method": "bca", **hp}]}
        with pytest.raises(SpecError, match=f"methods\\[0\\].{next(iter(hp))}: bca: hparam"):
            validate_spec(spec, base_dir=tmp_path)


def test_per_dataset_defaults_come_from_the_card():
    assert registry.method_card("tda").defaults("ImageNet-Sketch")["pos_beta"] == 7.45
    assert registry.method_card("bca").defaults("dtd")["tau"] == 0.35
    assert registry.method_card("bca").defaults("imagenet")["tau"] == 0.3
    assert registry.method_card("bca").defaults("synthetic-iid") == registry.method_card("bca").defaults()



def test_a_grid_expands_on_the_card_into_resolved_points():
    """The card's rules, once: values in their kind, per-dataset defaults, an inert hparam at its default (decay
    with update count), a null gate as tau's value; each distinct point once, as a run's config stores it."""
    card = registry.method_card("bca")
    points = list(card.grid_points({"tau": [0.2, 0.5], "tau_prior": [None, 0.5], "n1": [30000.0],
                                    "update": ["count", "decay"], "decay": [0.9, 0.99]}, "dtd"))
    assert all(list(p) == card.hparam_names for p in points)
    assert {type(p["n1"]) for p in points} == {int} and {p["n2"] for p in points} == {10}
    assert {(p["tau"], p["tau_likelihood"]) for p in points} == {(0.2, 0.2), (0.5, 0.5)}
    assert {p["decay"] for p in points if p["update"] == "count"} == {0.999}
    # tau 0.5 with tau_prior null and with 0.5 is one point; count gives one per (tau, tau_prior), decay two
    assert len(points) == 3 * (1 + 2) and len({tuple(p.values()) for p in points}) == len(points)
    assert list(card.grid_points({}, "dtd")) == [card.resolve({}, "dtd")]
    with pytest.raises(ValueError, match="hparam 'tau' must be"):
        list(card.grid_points({"tau": [1.5]}))

@pytest.mark.parametrize("spelling,name", [
    ("imagenet", "imagenet"), ("ImageNet-A", "imagenet-a"), ("imagenet_v2", "imagenet-v2"), ("V", "imagenet-v2"),
    ("imagenet-rendition", "imagenet-r"), ("ImageNet-Sketch", "imagenet-sketch"), ("imagenet_s", "imagenet-sketch"),
    ("K", "imagenet-sketch"), ("fgvc_aircraft", "aircraft"), ("Caltech101", "caltech101"), ("stanford_cars", "cars"),
    ("DTD", "dtd"), ("eurosat", "eurosat"), ("oxford_flowers", "flowers102"), ("food-101", "food101"),
    ("oxford_pets", "pets"), ("SUN397", "sun397"), ("ucf101", "ucf101"), ("synthetic_iid", None),
])
def test_one_alias_table(spelling, name):
    assert registry.dataset_key(spelling) == name


def test_dataset_cards_hold_the_protocol():
    assert len(registry.group_datasets(registry.OOD)) == 5 and len(registry.group_datasets(registry.CROSS_DOMAIN)) == 10
    assert registry.dataset_card("imagenet-a").num_classes == 200 and registry.dataset_card("a").test_images == 7500
    assert registry.dataset_card("dtd").templates == ("{} texture.",)
    with pytest.raises(ValueError, match="unknown dataset 'cifar10'; known datasets: imagenet, imagenet-a"):
        registry.canonical_dataset("cifar10")


def _package_files() -> list[Path]:
    return sorted((REPO / "orchestrator").rglob("*.py")) + sorted((REPO / "dashboard").rglob("*.py"))


# Where a literal may equal a method name: a method class naming its own card, the tool's own name ("bca" is
# the CLI and the package), and the fake-results helpers that tests use to write example runs.
_NAME_ALLOWED = {("orchestrator/cli.py", "bca"), ("orchestrator/features/cache.py", "bca")}
_TEST_SUPPORT = ("orchestrator/results/testing.py", "orchestrator/clip/testing.py")


def _card_folders() -> dict[str, set[str]]:
    """orchestrator/methods/<folder>/ -> the names and labels of the cards whose implementation lives there."""
    out: dict[str, set[str]] = {}
    for card in registry.method_cards():
        module = card.impl.partition(":")[0] if isinstance(card.impl, str) else card.impl.__module__
        parts = module.split(".")
        if parts[:2] == ["orchestrator", "methods"] and len(parts) > 3:
            out.setdefault(f"orchestrator/methods/{parts[2]}/", set()).update({card.name, card.label})
    return out


def test_no_method_or_dataset_spelling_outside_the_registry():
    """Method names and labels, and dataset aliases of three or more letters (one-letter codes such as 'a' are
    every file mode's too), appear as string literals only in orchestrator/registry and in a method's own folder:
    its names and labels there, dataset names in its card (per-dataset defaults)."""
    cards = registry.method_cards()
    aliases = {a for d in registry.DATASETS.values() for a in d.aliases if len(a) > 2}
    spelled = {c.name for c in cards} | {c.label for c in cards} | aliases
    folders = _card_folders()
    found = []
    for path in _package_files():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("orchestrator/registry/") or rel in _TEST_SUPPORT:
            continue
        own = next((names for folder, names in folders.items() if rel.startswith(folder)), set())
        if rel.endswith("/card.py") and own:
            own = own | aliases
        tree = ast.parse(path.read_text())
        families = _family_arguments(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in spelled and (rel, node.value) not in _NAME_ALLOWED
                    and node.value not in own and id(node) not in families):
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert found == []


def _family_arguments(tree: ast.AST) -> set[int]:
    """The `family` arguments of the MethodCard calls in a file: a colour family is a name of its own, free to equal
    a method's ("tda" for the methods built on TDA's caches)."""
    position = [f.name for f in dataclasses.fields(registry.MethodCard)].index("family")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "MethodCard":
            out |= {id(node.args[position])} if len(node.args) > position else set()
            out |= {id(k.value) for k in node.keywords if k.arg == "family"}
    return out


def test_registries_results_and_dashboard_queries_import_without_torch():
    code = ("import sys; import orchestrator.registry, orchestrator.results.schema, orchestrator.results.report, "
            "orchestrator.results.db, dashboard.queries, dashboard.charts; from orchestrator import registry; "
            "registry.method_cards(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
