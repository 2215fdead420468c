"""Run config normalisation, hashing and the path layout (orchestrator/results/schema.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.results import schema

BASE = {"sweep": "s", "backbone": "ViT-B-16", "dataset": "imagenet", "method": "bca", "seed": 1,
        "hparams": {"tau": 0.3, "n1": 30000, "n2": 10}}


def test_hash_is_stable_and_ignores_key_order_and_number_spelling():
    a = schema.config_hash(BASE)
    b = schema.config_hash({"hparams": {"n2": 10.0, "n1": np.int64(30000), "tau": 0.3}, "seed": np.int32(1),
                            "method": "bca", "dataset": "imagenet", "backbone": "ViT-B-16", "sweep": "s"})
    assert a == b
    assert len(a) == 16 and all(c in "0123456789abcdef" for c in a)
    assert schema.config_hash({**BASE, "seed": 2}) != a


def test_group_and_setting_ids():
    seed2 = {**BASE, "seed": 2}
    assert schema.group_id(BASE) == schema.group_id(seed2)
    clip = {**BASE, "method": "clip", "hparams": {}, "sweep": "other", "seed": 5}
    assert schema.setting_id(clip) == schema.setting_id(BASE)
    assert schema.setting_id({**BASE, "templates": "clip80"}) != schema.setting_id(BASE)


def test_the_sweep_name_is_part_of_the_run_id_and_not_of_the_setting_id():
    """As docs/reference-results.md says: one configuration under two sweep names is two runs sharing a setting."""
    other = {**BASE, "sweep": "other"}
    assert schema.config_hash(other) != schema.config_hash(BASE) and schema.group_id(other) != schema.group_id(BASE)
    assert schema.setting_id(other) == schema.setting_id(BASE)
    # a shipped id: the hash of a stored config never changes (every results dir's run_ids depend on it)
    assert schema.config_hash(BASE) == "966d4a24ef46d3ff"


def test_normalised_config_fills_optional_keys():
    cfg = schema.normalize_config({**BASE, "views": 64, "synthetic": {"noise": 0.1}})
    assert cfg["views"] == "64" and cfg["pretrained"] is None and cfg["num_templates"] is None
    assert cfg["synthetic"] == {"noise": 0.1}
    assert list(cfg["hparams"]) == sorted(cfg["hparams"])


def test_a_run_config_is_typed_and_its_stored_form_unchanged():
    """Read by attribute, normalised once; as a Mapping the dict that is hashed and stored, byte for byte."""
    from orchestrator.data.streams import stream_value

    stream = {"dirichlet": {"gamma": 0.01}}
    config = schema.RunConfig({**BASE, "hparams": {"n1": 30000.0}, "stream": stream, "batch_size": 1})
    assert (config.method, config.hparams, config.batch_size, config.stream) == ("bca", {"n1": 30000}, 1, stream)
    assert dict(config) == schema.normalize_config(config) and "batch_size" not in config
    assert config.run_id == schema.config_hash(dict(config)) and config.json == schema.canonical_json(dict(config))
    assert schema.RunConfig({**BASE, "batch_size": 64}).batch_size == 64
    # a stream stored as the runs table's column (a word as is, a mapping as JSON) or a data source's JSON
    assert [stream_value(v) for v in ("iid", '"iid"', schema.canonical_json(stream), None, float("nan"))] == [
        "iid", "iid", stream, None, None]


@pytest.mark.parametrize("change, message", [
    ({"sweep": ""}, "sweep: expected a non-empty string"),
    ({"seed": 1.5}, "seed: expected an integer"),
    ({"seed": None}, "missing required key 'seed'"),
    ({"method": 3}, "method: expected a non-empty string"),
    ({"hparams": {"n1": 0.5}}, "hparams.n1: expected an integer"),
    ({"hparams": {"tau": "high"}}, "hparams.tau: expected a number"),
    ({"hparams": {"update": 1}}, "hparams.update: expected a string"),
    ({"hparams": {"status": 1}}, "collides with the runs-table column"),
    ({"hparams": {"bad name": 1}}, "not a valid column name"),
    ({"hparams": [1]}, "hparams: expected a dict"),
    ({"run_id": "abc"}, "'run_id' is derived"),
    ({"views": True}, "views: expected a string or an integer"),
    ({"extra": float("nan")}, "config.extra: expected a finite number"),
    ({"extra": object()}, "expected a JSON value"),
])
def test_bad_configs_name_the_field(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        schema.normalize_config({**BASE, **change})


def test_paths_encode_partition_values(tmp_path):
    cfg = schema.normalize_config({**BASE, "sweep": "a/b c", "backbone": "hf-hub:org/model"})
    run_id = schema.config_hash(cfg)
    d = schema.run_samples_dir(tmp_path, cfg, run_id)
    assert d.relative_to(tmp_path).parts == ("samples", "sweep=a%2Fb%20c", "backbone=hf-hub%3Aorg%2Fmodel",
                                             "dataset=imagenet", "method=bca", f"run_id={run_id}")
    assert schema.run_file(tmp_path, "a/b c", run_id) == tmp_path / "runs" / "sweep=a%2Fb%20c" / f"run_id={run_id}.parquet"
    assert schema.state_file(tmp_path, run_id) == tmp_path / "artifacts" / run_id / "state.npz"
    with pytest.raises(ValueError, match="run_id: expected 16 lowercase hex"):
        schema.state_file(tmp_path, "../../etc")


def test_part_and_temp_names():
    assert schema.part_name(1234) == "part-000001234.parquet"
    assert schema.part_start("part-000001234.parquet") == 1234
    assert schema.part_start("part-1.parquet") is None
    tmp = schema.temp_name(schema.part_name(0), "123.ab")
    assert schema.is_temp_name(tmp) and not tmp.endswith(".parquet")
    assert Path(tmp).match(".*") and not Path(tmp).match("part-*.parquet")


def test_results_dir_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert schema.resolve_results_dir(None) == tmp_path / "results"
    assert schema.resolve_results_dir("x").is_absolute()


def test_run_schema_has_every_hparam_column_and_extras():
    names = schema.run_table_schema({"tau": 0.3, "keep": 0.1, "flag": True}).names
    for col in ("tau", "tau_likelihood", "tau_prior", "n1", "n2", "logit_scale", "update", "select_on",
                "state_dtype", "pos_alpha", "pos_beta", "neg_alpha", "neg_beta", "status", "config_json"):
        assert col in names
    assert "keep" in names  # zero's, from its registry card
    assert names[-1] == "flag"  # no card declares it: typed from its value, after the fixed columns
