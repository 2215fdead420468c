"""The corruption benchmarks (ImageNet-C, CIFAR-10-C, CIFAR-100-C) on tiny fixtures in their released layouts: the
readers, the spec's {name, corruption, severity} grid and its errors, the feature cache per (corruption,
severity), a continual stream through the corruptions in CoTTA's order, and the report's error tables, end to end
through a sweep with the tiny open_clip model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.clip.testing import TINY_VIT, build_corrupted, write_model_config
from orchestrator.data.datasets import DatasetLayoutError, open_image
from orchestrator.data.listing import read_dataset
from orchestrator.registry import dataset_key
from orchestrator.registry.corruptions import CORRUPTIONS
from orchestrator.sweep.load import SpecError, validate_spec

COTTA_ORDER = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
               "jpeg_compression"]


def test_cifar_c_reads_one_severity_of_the_stacked_array(tmp_path):
    build_corrupted("cifar10-c", tmp_path, ("fog",), num_classes=3, per_class=2)
    stacked = np.load(tmp_path / "CIFAR-10-C" / "fog.npy")
    labels = np.load(tmp_path / "CIFAR-10-C" / "labels.npy")
    assert stacked.shape == (5 * 6, 32, 32, 3) and labels.shape == (30,)
    images = read_dataset("cifar10-c.fog.3", tmp_path)
    assert images.image_ids == [f"CIFAR-10-C/fog.npy:{r}" for r in range(12, 18)]  # rows 2N..3N-1: severity 3
    assert images.labels == labels[12:18].tolist()
    assert images.class_names[:3] == ["airplane", "automobile", "bird"]
    assert np.array_equal(np.asarray(open_image(images.path(1))), stacked[13])
    assert dataset_key("CIFAR-10-C fog 3") == "cifar10-c.fog.3"


def test_imagenet_c_reads_the_corruption_and_severity_folder(tmp_path):
    build_corrupted("imagenet-c", tmp_path, ("snow",), num_classes=2, per_class=2)
    images = read_dataset("imagenet-c.snow.2", tmp_path)
    assert all(i.startswith("ImageNet-C/snow/2/n0") and i.endswith(".JPEG") for i in images.image_ids)
    assert images.labels == [0, 0, 1, 1]
    assert images.class_names[:2] == ["tench", "goldfish"] and len(images.class_names) == 1000


def test_bad_cifar_c_files_name_the_file(tmp_path):
    folder = build_corrupted("cifar10-c", tmp_path, ("fog",))
    with pytest.raises(DatasetLayoutError, match="snow.npy does not exist"):
        read_dataset("cifar10-c.snow.5", tmp_path)
    np.save(folder / "labels.npy", np.zeros(7, np.int64))
    with pytest.raises(DatasetLayoutError, match=r"labels.npy has shape \[7\]; expected \[30\]"):
        read_dataset("cifar10-c.fog.5", tmp_path)


def _spec(tmp_path: Path, **overrides) -> dict:
    config = write_model_config(TINY_VIT, tmp_path / "models")
    return {"name": "corrupt", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
            "datasets": [{"name": "cifar10-c", "corruption": ["gaussian_noise", "fog"], "severity": [3, 5]}],
            "methods": [{"method": "clip"}], "seeds": [1], **overrides}


def test_lists_of_corruptions_and_severities_are_a_grid_axis(tmp_path):
    build_corrupted("cifar10-c", tmp_path / "data", ("gaussian_noise", "fog"))
    spec = validate_spec(_spec(tmp_path), base_dir=tmp_path)
    assert [d.name for d in spec.datasets] == ["cifar10-c.gaussian_noise.3", "cifar10-c.gaussian_noise.5",
                                               "cifar10-c.fog.3", "cifar10-c.fog.5"]
    from orchestrator.sweep.plan import expand

    # a method entry naming the benchmark runs on all its variants
    spec = validate_spec(_spec(tmp_path, methods=[{"method": "clip", "datasets": ["CIFAR-10-C"]}]), base_dir=tmp_path)
    assert sorted(run.config["dataset"] for run in expand(spec)) == sorted(d.name for d in spec.datasets)


@pytest.mark.parametrize("entry, field, message", [
    ({"name": "cifar10-c", "corruption": "gaussian", "severity": 5}, "datasets[0].corruption",
     "expected one of gaussian_noise, shot_noise, "),
    ({"name": "cifar10-c", "corruption": "fog", "severity": 6}, "datasets[0].severity",
     "expected one of 1, 2, 3, 4, 5, or a list of them (got 6)"),
    ({"name": "cifar10-c", "corruption": "fog", "severity": [5, 0]}, "datasets[0].severity", "expected one of 1, 2"),
    ({"name": "cifar100-c", "corruption": "fog"}, "datasets[0]", "severity is missing"),
    ({"name": "imagenet", "corruption": "fog"}, "datasets[0]",
     "(a dataset without a released corrupted copy has its corruptions generated); severity is missing"),
])
def test_bad_corruption_entries_are_refused_naming_the_field(tmp_path, entry, field, message):
    with pytest.raises(SpecError) as info:
        validate_spec(_spec(tmp_path, datasets=[entry]), base_dir=tmp_path)
    assert f"{field}: " in str(info.value) and message in str(info.value)


def test_bca_sweep_exits_2_naming_the_field(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_spec(tmp_path, datasets=[{"name": "cifar10-c", "corruption": "fog",
                                                               "severity": 9}])))
    result = CliRunner().invoke(app, ["sweep", str(path), "--dry-run"])
    assert result.exit_code == 2
    assert "datasets[0].severity: expected one of 1, 2, 3, 4, 5" in result.output


def test_continual_entry_is_the_15_corruptions_in_cottas_order():
    from orchestrator.data.streams import protocol_from_spec

    protocol = protocol_from_spec({"continual": [{"name": "CIFAR-100-C", "corruption": "all", "severity": 5}]})
    assert list(CORRUPTIONS) == COTTA_ORDER
    assert protocol.datasets == tuple(f"cifar100-c.{c}.5" for c in COTTA_ORDER)
    with pytest.raises(ValueError, match="corruption 'dust': expected one of gaussian_noise"):
        protocol_from_spec({"continual": [{"name": "cifar10-c", "corruption": "dust", "severity": 5}]})


def test_sweep_grid_and_continual_stream_then_the_corruption_tables(tmp_path, monkeypatch):
    """A sweep over a corruption/severity grid and the continual stream of the 15 at severity 5, through the
    feature cache (an entry per corruption and severity), the rows (each sample's corruption in `source`) and
    `bca report`'s tables, whose numbers are recomputed here from the stored rows."""
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import report_tables
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.trial import execute_trial

    # 17 tiny cache entries: decoded in the encoding process, not in DataLoader worker processes started for each
    monkeypatch.setattr("orchestrator.features.cache.default_workers", lambda: 0)
    build_corrupted("cifar10-c", tmp_path / "data", num_classes=10, per_class=1)
    all5 = {"name": "cifar10-c", "corruption": "all", "severity": 5}
    grid = {"name": "cifar10-c", "corruption": ["gaussian_noise", "fog"], "severity": [3, 5]}
    spec = validate_spec(_spec(tmp_path, datasets=[grid], stream=["iid", {"continual": [all5]}],
                               methods=[{"method": "clip"}, {"method": "tda"}]), base_dir=tmp_path)
    settings = settings_of(spec)
    for trial in make_trials(expand(spec), "auto"):
        execute_trial(trial, settings)
    entries = list((tmp_path / "cache" / "features").glob("*/manifest.json"))
    assert len(entries) == 17  # one per (corruption, severity): the 15 at severity 5, gaussian_noise and fog at 3
    db = ResultsDB(spec.results_dir)
    rows = db.df("SELECT r.method, r.dataset, s.source, s.correct, s.is_ood FROM samples s JOIN runs r USING (run_id)")
    continual = rows[rows["dataset"] == "cifar10-c.continual.5"]
    assert sorted(continual["source"].unique()) == sorted(f"cifar10-c.{c}.5" for c in COTTA_ORDER)
    assert len(continual) == 2 * 15 * 10  # clip and tda, 10 samples of each corruption
    assert 0 < rows["correct"].mean() < 1

    tables = report_tables(db)
    by_title = {t.title.split(",")[0] + ("/continual" if "continual" in t.title else "") + (
        "/s3" if "severity 3" in t.title else ""): t for t in tables}
    grid, stream = by_title["CIFAR-10-C"], by_title["CIFAR-10-C/continual"]
    assert "error (%)" in grid.title and grid.columns == [*COTTA_ORDER, "Mean"]
    iid = rows[rows["dataset"] != "cifar10-c.continual.5"]
    for (method, source), part in iid[iid["dataset"].str.endswith(".5")].groupby(["method", "dataset"]):
        key = next(k for k in grid.mean.index if k[1].startswith({"clip": "CLIP", "tda": "TDA"}[method]))
        assert grid.mean.at[key, source.split(".")[1]] == pytest.approx(100 * (1 - part["correct"].mean()))
    assert grid.mean[["shot_noise", "snow"]].isna().all().all()  # not run one by one: no cell
    for method, part in continual.groupby("method"):
        key = next(k for k in stream.mean.index if k[1].startswith({"clip": "CLIP", "tda": "TDA"}[method]))
        errors = {s.split(".")[1]: 100 * (1 - p["correct"].mean()) for s, p in part.groupby("source")}
        assert stream.mean.loc[key, COTTA_ORDER].tolist() == pytest.approx([errors[c] for c in COTTA_ORDER])
        assert stream.mean.at[key, "Mean"] == pytest.approx(np.mean(list(errors.values())))
    assert "fog" in by_title["CIFAR-10-C/s3"].columns
    from typer.testing import CliRunner

    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["report", "--results", str(spec.results_dir)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "CIFAR-10-C, severity 3, error (%)" in text

    assert "CIFAR-10-C, severity 5, continual stream" in text and "jpeg_compression" in text


def test_imagenet_c_sweep_and_its_table(tmp_path, monkeypatch):
    """ImageNet-C's layout through a sweep at two severities (one prompt per class: 1,000 prompts for the tiny text
    tower), and its table's cells from the stored rows."""
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import report_tables
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.trial import execute_trial

    monkeypatch.setattr("orchestrator.features.cache.default_workers", lambda: 0)
    build_corrupted("imagenet-c", tmp_path / "data", ("fog",), num_classes=2, per_class=2)
    spec = validate_spec(_spec(tmp_path, datasets=[{"name": "imagenet-c", "corruption": "fog", "severity": [1, 5]}],
                               templates="tpt1"), base_dir=tmp_path)
    settings = settings_of(spec)
    for trial in make_trials(expand(spec), "auto"):
        execute_trial(trial, settings)
    db = ResultsDB(spec.results_dir)
    rows = db.df("SELECT r.dataset, s.correct, s.image_id FROM samples s JOIN runs r USING (run_id)")
    assert sorted(rows["dataset"].unique()) == ["imagenet-c.fog.1", "imagenet-c.fog.5"]
    assert rows[rows["dataset"] == "imagenet-c.fog.5"]["image_id"].str.startswith("ImageNet-C/fog/5/").all()
    tables = {t.title.split(", error")[0]: t for t in report_tables(db)}
    for severity in (1, 5):
        table = tables[f"ImageNet-C, severity {severity}"]
        part = rows[rows["dataset"] == f"imagenet-c.fog.{severity}"]
        assert table.mean["fog"].tolist() == pytest.approx([100 * (1 - part["correct"].mean())])
        assert table.mean["Mean"].isna().all()  # one corruption of 15: no mean


def test_a_cotta_continual_run_records_a_short_dataset_name():
    from orchestrator.docs import datasets_table
    from orchestrator.registry.corruptions import continual_name, continual_variants

    fifteen = tuple(f"cifar10-c.{c}.5" for c in COTTA_ORDER)
    assert continual_name(fifteen) == "cifar10-c.continual.5"  # the joined names are too long for a folder name
    assert continual_variants("cifar10-c.continual.5") == fifteen
    assert continual_name(fifteen[:2]) == "cifar10-c.gaussian_noise.5+cifar10-c.shot_noise.5"
    assert continual_variants("cifar10-c.gaussian_noise.5+cifar10-c.shot_noise.5") == fifteen[:2]
    assert continual_variants("imagenet+imagenet-v2") is None
    assert dataset_key("cifar100-c.snow.1") == "cifar100-c.snow.1"
    assert "snow" not in datasets_table()  # variants, registered on first use, stay out of the datasets table
