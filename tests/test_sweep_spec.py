"""Sweep spec validation: a table of malformed specs, each rejected with the field path and what was expected;
plus path resolution, expansion into runs and trials, and the sweep record. No Ray here."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from orchestrator.clip.testing import build_all, build_dataset
from orchestrator.sweep.load import SpecError, load_spec, validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.record import check_sweep_record, write_sweep_record

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "t",
    "results_dir": "results",
    "datasets": [{"synthetic": "label_shift", "n": 50, "num_classes": 5},
                 {"synthetic": "temporal", "n": 50, "num_classes": 5}],
    "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.2, 0.3], "n1": 100}, {"method": "tda"}],
    "seeds": [1, 2],
}


def _real(d: dict, root: Path, **extra) -> None:
    """Add a real dataset with everything it needs (data root holding it, cache dir, backbone), then `extra`."""
    if not (root / "data" / "dtd").is_dir():
        build_dataset("dtd", root / "data")
    d["datasets"].append("dtd")
    d.update(data_root=str(root / "data"), cache_dir="cache", backbones=[{"model": "RN50", "pretrained": "random"}])
    d.update(extra)


def _set(path: str, value):
    """A mutation setting d[path] (dotted, list indices as numbers) to value."""
    def apply(d: dict, root: Path) -> None:
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = d
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return apply


def _drop(key: str):
    return lambda d, root: d.pop(key)


def _append_method(entry: dict):
    return lambda d, root: d["methods"].append(entry)


def test_duplicate_sweep_name_with_a_different_config_is_refused_by_the_plan(tmp_path):
    other = validate_spec({**copy.deepcopy(BASE), "seeds": [7]}, base_dir=tmp_path)
    write_sweep_record(other, expand(other))
    spec = validate_spec(copy.deepcopy(BASE), base_dir=tmp_path)  # the document alone is valid
    problem = check_sweep_record(spec, expand(spec))
    assert "already exists" in problem and "leaves out 8 of its 8 recorded runs" in problem
    assert "changed: seeds: [7] -> [1, 2]" in problem


def test_growing_a_sweep_keeps_its_runs_and_changing_one_is_refused_with_what_changed(tmp_path):
    spec = validate_spec(copy.deepcopy(BASE), base_dir=tmp_path)
    write_sweep_record(spec, expand(spec))
    grown = copy.deepcopy(BASE)
    grown["methods"][1]["tau"] = [0.2, 0.3, 0.4]
    grown["seeds"] = [1, 2, 3]
    grown_spec = validate_spec(grown, base_dir=tmp_path)
    assert check_sweep_record(grown_spec, expand(grown_spec)) is None
    assert {r.run_id for r in expand(spec)} < {r.run_id for r in expand(grown_spec)}
    changed = copy.deepcopy(BASE)
    changed["methods"][1]["n1"] = 200
    changed_spec = validate_spec(changed, base_dir=tmp_path)
    problem = check_sweep_record(changed_spec, expand(changed_spec))
    assert "leaves out 8 of its 16 recorded runs (changed: methods[1].n1: 100 -> 200)" in problem


# (case, mutation, field path the message must name, what it must say is expected)
CASES = [
    ("unknown top-level key", _set("nmae", "x"), "nmae", "allowed keys: backbones, batch_size, cache_dir"),
    ("seeds of the wrong type", _set("seeds", "one"), "seeds[0]", "valid integer"),
    ("negative seed", _set("seeds", [-1]), "seeds[0]", "greater than or equal to 0"),
    ("repeated seed", _set("seeds", [1, 1]), "seeds[1]", "expected distinct seeds"),
    ("negative n1", _set("methods.1.n1", -5), "methods[1].n1", "must be an integer >= 0"),
    ("fractional n1", _set("methods.1.n1", 0.5), "methods[1].n1", "must be an integer >= 0"),
    ("tau above 1", _set("methods.1.tau", 1.5), "methods[1].tau", "[0, 1]"),
    ("tau below 0 in a grid", _set("methods.1.tau", [0.2, -0.1]), "methods[1].tau[1]", "[0, 1]"),
    ("tau as a string", _set("methods.1.tau", "high"), "methods[1].tau", "[0, 1]"),
    ("empty grid", _set("methods.1.tau", []), "methods[1].tau", "at least 1 item"),
    ("unknown method", _set("methods.1.method", "bcaa"), "methods[1].method", "one of: clip, la, pa, bca, tda, tda_pa"),
    ("hparam the method lacks", _set("methods.0.tau", 0.3), "methods[0].tau", "allowed keys: batch_size, context, datasets, logit_scale, method"),
    ("unknown update rule", _set("methods.1.update", "sgd"), "methods[1].update", "'count', 'momentum', 'decay'"),
    ("method limited to a dataset the spec lacks", _set("methods.1.datasets", ["synthetic-iid"]),
     "methods[1].datasets[0]", "expected one of: synthetic-label_shift, synthetic-temporal"),
    ("tau_prior above 1", _set("methods.1.tau_prior", 2), "methods[1].tau_prior", "[0, 1]"),
    ("negative TDA alpha", _set("methods.2.pos_alpha", -1.0), "methods[2].pos_alpha", "pos_alpha"),
    ("select_on posterior with M > K",
     lambda d, root: (d["datasets"][0].update(templates_per_class=2), d["methods"][1].update(select_on="posterior")),
     "methods[1].select_on", "expected 'likelihood'"),
    ("zero without views", _append_method({"method": "zero"}), "methods[3].method", "needs views (got single)"),
    ("empty methods", _set("methods", []), "methods", "at least 1 item"),
    ("missing methods", _drop("methods"), "methods", "Field required"),
    ("missing results_dir", _drop("results_dir"), "results_dir", "Field required"),
    ("GPU fraction above 1", _set("resources", {"gpu": 2}), "resources.gpu", "less than or equal to 1"),
    ("zero CPUs", _set("resources", {"cpus": 0}), "resources.cpus", "greater than 0"),
    ("unknown resource key", _set("resources", {"gpus": 1}), "resources.gpus", "allowed keys: cpus, gpu"),
    ("no GPU memory", _set("resources", {"gpu": 1, "gpu_memory_gb": 0}), "resources.gpu_memory_gb", "greater than 0"),
    ("pack of 0", _set("pack", 0), "pack", "greater than or equal to 1"),
    ("name with a slash", _set("name", "a/b"), "name", "should match pattern"),
    ("unknown synthetic scenario", _set("datasets.0.synthetic", "lbl"), "datasets[0].synthetic",
     "'iid', 'label_shift', 'temporal', 'continual', 'imagenet_like', 'fine_grained' or 'long_tailed'"),
    ("unknown synthetic parameter", _set("datasets.0.classes", 5), "datasets[0].classes", "allowed keys: dim"),
    ("negative synthetic noise", _set("datasets.0.noise", -1.0), "datasets[0].noise", ">= 0"),
    ("two datasets with one name", lambda d, root: d["datasets"].append({"synthetic": "label_shift"}),
     "datasets[2]", "expected unique names"),
    ("views misspelt", _set("views", "augmax"), "views", "protocol|single|augmix"),
    ("unknown real dataset", lambda d, root: d["datasets"].append("imagenet-z"), "datasets[2].name",
     "known datasets: imagenet, imagenet-a"),
    ("real dataset without a data root", lambda d, root: (_real(d, root), d.pop("data_root")), "data_root",
     "expected the directory that holds the dataset folders"),
    ("data root that does not exist", lambda d, root: _real(d, root, data_root=str(root / "nowhere")), "data_root",
     "does not exist"),
    ("real dataset without a cache dir", lambda d, root: (_real(d, root), d.pop("cache_dir")), "cache_dir",
     "expected a directory for the feature cache"),
    ("real dataset without a backbone", lambda d, root: _real(d, root, backbones=[]), "backbones",
     "expected a list such as"),
    ("unknown backbone", lambda d, root: _real(d, root, backbones=[{"model": "ViT-Z-99", "pretrained": "random"}]), "backbones[0].model",
     "open_clip.list_models()"),
    ("unknown pretrained tag", lambda d, root: _real(d, root, backbones=[{"model": "RN50", "pretrained": "openia"}]),
     "backbones[0].pretrained", "expected one of: openai"),
    ("missing checkpoint file", lambda d, root: _real(d, root, backbones=[{"model": "RN50", "checkpoint": "w.pt"}]),
     "backbones[0].checkpoint", "does not exist"),
    ("tag and checkpoint together",
     lambda d, root: _real(d, root, backbones=[{"model": "RN50", "pretrained": "openai", "checkpoint": "w.pt"}]),
     "backbones[0]", "either pretrained"),
    ("unknown template set", lambda d, root: _real(d, root, templates=["handcrafted9"]), "templates[0]",
     "expected protocol (each method's official set, the default) or one of: dataset, ensemble7"),
    ("unknown template set in a synthetic-only spec", _set("templates", ["handcrafted9"]), "templates[0]",
     "expected protocol (each method's official set, the default) or one of: dataset, ensemble7"),
    ("backbone without weights", lambda d, root: _real(d, root, backbones=[{"model": "RN50"}]),
     "backbones[0].pretrained", "would run with random weights; expected a tag (e.g. openai), a checkpoint file, "
                                "or pretrained: random"),
    ("dataset folder missing under an existing data root",
     lambda d, root: (_real(d, root), d["datasets"].append("eurosat")), "datasets[3]", "EuroSAT"),
    ("results_dir that is a file", lambda d, root: ((root / "out").write_text("x"), d.update(results_dir="out")),
     "results_dir", "is a file; expected a directory"),
    ("results_dir under a file", lambda d, root: ((root / "out").write_text("x"), d.update(results_dir="out/r")),
     "results_dir", "which is a file; expected a directory"),
]


@pytest.mark.parametrize("case,mutate,path,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_spec_names_field_and_expected_value(tmp_path, case, mutate, path, expected):
    data = copy.deepcopy(BASE)
    mutate(data, tmp_path)
    with pytest.raises(SpecError) as info:
        validate_spec(data, source="bad.yaml", base_dir=tmp_path)
    lines = [f"{p}: {m}" for p, m in info.value.issues]
    assert any(line.startswith(f"{path}: ") and expected in line for line in lines), (case, str(info.value))
    assert str(info.value).startswith("bad.yaml: invalid sweep spec")


def test_the_table_covers_twenty_kinds_of_mistake():
    assert len(CASES) >= 20


def test_yaml_problems_name_the_file(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: a\nseeds: [1]\nseeds: [2]\n")
    with pytest.raises(SpecError, match=r"(?s)s\.yaml.*duplicate key 'seeds'"):
        load_spec(spec)
    spec.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(spec)
    spec.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="a sweep spec is a mapping"):
        load_spec(spec)
    with pytest.raises(SpecError, match="cannot read the spec file"):
        load_spec(tmp_path / "missing.yaml")


def test_every_problem_is_reported_at_once(tmp_path):
    data = copy.deepcopy(BASE)
    data["methods"][1]["tau"] = 2.0
    data["methods"][2]["pos_beta"] = -1.0
    data["seeds"] = [3, 3]
    with pytest.raises(SpecError) as info:
        validate_spec(data, base_dir=tmp_path)
    assert {p for p, _ in info.value.issues} == {"methods[1].tau", "methods[2].pos_beta", "seeds[1]"}


def test_paths_are_absolute_relative_to_the_spec_file(tmp_path, monkeypatch):
    (tmp_path / "exp").mkdir()
    spec_file = tmp_path / "exp" / "s.yaml"
    spec_file.write_text(yaml.safe_dump({**BASE, "results_dir": "../out"}))
    monkeypatch.chdir("/")
    spec = load_spec(spec_file)
    assert spec.results_dir == str(tmp_path / "out")


def test_expansion_is_the_cartesian_product_with_stable_run_ids(tmp_path):
    spec = validate_spec(copy.deepcopy(BASE), base_dir=tmp_path)
    runs = expand(spec)
    # 2 datasets x 2 seeds x (clip + 2 bca taus + tda)
    assert len(runs) == 2 * 2 * 4
    assert len({r.run_id for r in runs}) == len(runs)
    assert [r.run_id for r in runs] == [r.run_id for r in expand(validate_spec(copy.deepcopy(BASE), base_dir=tmp_path))]
    bca = [r for r in runs if r.config["method"] == "bca"]
    assert {r.config["hparams"]["tau"] for r in bca} == {0.2, 0.3}
    assert all(r.config["hparams"]["n1"] == 100 and r.config["hparams"]["n2"] == 10 for r in bca)
    synthetic = runs[0].config
    assert synthetic["backbone"] == "synthetic" and synthetic["stream_order"] == "scenario"
    assert synthetic["synthetic"]["n"] == 50 and "noise" in synthetic["synthetic"]  # defaults pinned


def test_the_plans_fast_paths_give_the_plain_configs_and_run_ids(tmp_path):
    """The plan hashes a grid's products without building each point's config (schema.grid_run_ids) and hands each
    run its config as stored (RunConfig.of_normal, not normalised again): the same run_ids, configs and order as
    the plain path, normalize_config and run_id_of over the card's grid_points, on a grid whose sub-grids overlap
    (an inert decay with update count, a null tau_prior and its explicit equal) and a realtime stream."""
    from orchestrator.registry import method_card
    from orchestrator.results.schema import normalize_config, run_id_of

    grid = {"tau": [0.2, 0.5], "tau_prior": [None, 0.5], "update": ["count", "decay"], "decay": [0.9, 0.99],
            "n2": [1, 5]}
    spec = validate_spec({**copy.deepcopy(BASE), "methods": [{"method": "bca", **grid}, {"method": "tda"}],
                          "stream": {"realtime": {"base": "iid", "k": 3}}}, base_dir=tmp_path)
    runs = expand(spec)
    for source in dict.fromkeys(r.source for r in runs):
        for method, method_grid in (("bca", grid), ("tda", {})):  # tda at its defaults: a grid of one point
            mine = [r for r in runs if r.source == source and r.method == method]
            base = {k: v for k, v in mine[0].config.items() if k != "hparams"}
            plain = [normalize_config({**base, "hparams": point})
                     for point in method_card(method).grid_points(method_grid)]
            assert [r.run_id for r in mine] == [run_id_of(c) for c in plain]
            assert [dict(r.config) for r in mine] == plain and mine[0].config.realtime_k == 3
    assert len(runs) == 2 * 2 * (2 * 3 * (1 + 2) + 1)


def test_runs_sharing_a_source_are_packed_together(tmp_path):
    spec = validate_spec({**copy.deepcopy(BASE), "pack": 3}, base_dir=tmp_path)
    runs = expand(spec)
    trials = make_trials(runs, spec.pack)
    assert sum(len(t.runs) for t in trials) == len(runs)
    assert all(len({r.source for r in t.runs}) == 1 and len(t.runs) <= 3 for t in trials)
    assert len(trials) == 2 * 2 * 2  # 4 runs per source -> a pack of 3 and one of 1
    assert len({t.key for t in trials}) == len(trials)


def test_same_config_under_the_same_name_is_accepted(tmp_path):
    spec = validate_spec(copy.deepcopy(BASE), base_dir=tmp_path)
    path = write_sweep_record(spec, expand(spec))
    assert json.loads(path.read_text())["name"] == "t"
    assert check_sweep_record(spec, expand(spec)) is None
    changed = validate_spec({**copy.deepcopy(BASE), "resources": {"cpus": 2}, "pack": 4}, base_dir=tmp_path)
    assert check_sweep_record(changed, expand(changed)) is None  # resources and packing do not change results


@pytest.mark.parametrize("name", ["demo", "paper_ood", "paper_cross_domain", "sensitivity", "templates"])
def test_shipped_specs_are_valid(name, tmp_path):
    text = (REPO / "experiments" / f"{name}.yaml").read_text()
    data = yaml.safe_load(text)
    if "data_root" in data:  # the paper specs point at the user's data; validate against tiny stand-ins
        build_all(tmp_path)
        data["data_root"] = str(tmp_path)
    spec = validate_spec(data, base_dir=REPO / "experiments")
    assert expand(spec)


def test_run_ids_are_the_config_hash_of_the_stored_config(tmp_path):
    from orchestrator.results.schema import config_hash

    data = copy.deepcopy(BASE)
    data["methods"].append({"method": "pa", "tau": [0.25, 1], "n2": [5, 10.0], "logit_scale": 50})
    runs = expand(validate_spec(data, base_dir=tmp_path))
    assert all(config_hash(r.config) == r.run_id for r in runs)


def test_settings_that_cannot_affect_a_run_do_not_multiply_the_grid(tmp_path):
    from orchestrator.sweep.checks import spec_warnings

    plain = {**copy.deepcopy(BASE), "methods": [{"method": "bca", "update": "count"}]}
    data = {**copy.deepcopy(BASE), "methods": [{"method": "bca", "update": ["count", "decay"],
                                                "decay": [0.9, 0.99, 0.999]}]}
    runs = expand(validate_spec(data, base_dir=tmp_path))
    # per dataset and seed: one count run (decay inert) + three decay runs, not six
    assert len(runs) == 2 * 2 * 4
    count = [r for r in runs if r.config["hparams"]["update"] == "count"]
    assert {r.config["hparams"]["decay"] for r in count} == {0.999}
    # the count runs are the very runs a spec that never named decay gives (same run_ids)
    assert {r.run_id for r in count} == {r.run_id for r in expand(validate_spec(plain, base_dir=tmp_path))}
    warnings = spec_warnings(validate_spec(data, base_dir=tmp_path))
    assert warnings == ["methods[0].decay: matters only with update: decay; the runs with update: count take its "
                        "default (0.999) and are not repeated per decay value"]
    assert spec_warnings(validate_spec(plain, base_dir=tmp_path)) == []


def test_random_weights_are_explicit_and_recorded_as_such(tmp_path):
    data = copy.deepcopy(BASE)
    _real(data, tmp_path)
    runs = expand(validate_spec(data, base_dir=tmp_path))
    real = [r for r in runs if r.config["dataset"] == "dtd"]
    assert real and all(r.config["pretrained"] == "random" and r.source.weights is None for r in real)


@pytest.mark.parametrize("key, value, shown", [("batch_size", 0, "batch_size[0]: expected an integer >= 1"),
                                               ("batch_size", -4, "batch_size[0]: expected an integer >= 1"),
                                               ("pack", 0, "pack: expected 'auto' or an integer"),
                                               ("pack", "many", "pack: expected 'auto' or an integer")])
def test_a_bad_batch_size_or_pack_names_the_value_given(tmp_path, key, value, shown):
    with pytest.raises(SpecError) as info:
        validate_spec({**copy.deepcopy(BASE), key: value}, base_dir=tmp_path)
    message = str(info.value)
    assert shown in message and f"(got {value!r})" in message and "{" not in message
