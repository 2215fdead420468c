"""Datasets as open as methods: a folder in the generic class-folder layout runs with no code, a dataset with a
reader of its own is one card in a plugin module; both go through a Ray sweep (`bca sweep`), `bca report` and the
dashboard, and each bad input is refused naming the file or field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import registry
from orchestrator.clip.testing import TINY_VIT, write_image, write_model_config
from orchestrator.data.datasets import DatasetLayoutError
from orchestrator.data.listing import read_dataset
from orchestrator.registry.datasets import DatasetCard, folder_dataset

REPO = Path(__file__).resolve().parents[1]
BCA = str(Path(sys.executable).with_name("bca"))

SHAPES = ["circle", "square", "triangle"]

# A user's dataset with its own reader: one CSV of (file, class) lines; the card is all the code there is.
PLUGIN = '''
import csv
from pathlib import Path

from orchestrator.registry import DatasetCard, register_dataset


def read_toycsv(data_root: Path, card: DatasetCard):
    with open(data_root / card.folder / "labels.csv", newline="") as f:
        rows = list(csv.reader(f))
    classes = sorted({c for _, c in rows})
    return [f"{card.folder}/{p}" for p, _ in rows], [classes.index(c) for _, c in rows], classes


register_dataset(DatasetCard("toycsv", "Toy CSV", "other", 2, 8, "toy_csv", "toy_csv/labels.csv and its images",
                             read_toycsv, ("a drawing of a {}.",)))
'''


def write_folder_dataset(root: Path, name: str = "toyshapes", per_class: int = 4) -> Path:
    folder = root / name
    for label, shape in enumerate(SHAPES):
        for i in range(per_class):
            write_image(folder / f"{label}_{shape}" / f"img{i}.png", label, i)
    (folder / "classnames.txt").write_text("\n".join(SHAPES) + "\n")
    (folder / "templates.txt").write_text("a photo of a {c}.\na drawing of a {c}.\n")
    return folder


def write_csv_dataset(root: Path) -> None:
    folder = root / "toy_csv"
    lines = []
    for label, cls in enumerate(["cat", "dog"]):
        for i in range(4):
            write_image(folder / "img" / f"{cls}{i}.jpg", label + 5, i)
            lines.append(f"img/{cls}{i}.jpg,{cls}")
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")


def test_a_class_folder_is_a_dataset(tmp_path):
    write_folder_dataset(tmp_path)
    card = registry.ensure_dataset("toyshapes", tmp_path)
    assert card.templates == ("a photo of a {}.", "a drawing of a {}.") and card.num_classes == 3
    assert card.test_images is None and not card.paper  # its completeness is unknown; never a paper table
    images = read_dataset("toyshapes", tmp_path)
    assert images.class_names == SHAPES and len(images) == 12
    assert images.labels == [k for k in range(3) for _ in range(4)]
    assert images.image_ids[0] == "toyshapes/0_circle/img0.png"


@pytest.mark.parametrize("breakage, message", [
    ("no_templates", "templates.txt is missing"),
    ("no_slot", "each with exactly one {c}"),
    ("twice", "lists 'square' more than once"),
])
def test_a_bad_class_folder_is_named(tmp_path, breakage, message):
    folder = write_folder_dataset(tmp_path, name=f"bad_{breakage}")
    if breakage == "no_templates":
        (folder / "templates.txt").unlink()
    elif breakage == "no_slot":
        (folder / "templates.txt").write_text("a photo\n")
    else:
        (folder / "classnames.txt").write_text("circle\nsquare\nsquare\n")
    with pytest.raises(ValueError, match=message):
        folder_dataset(folder.name, tmp_path)


def test_class_names_and_folders_must_agree(tmp_path):
    folder = write_folder_dataset(tmp_path, name="mismatch")
    (folder / "classnames.txt").write_text("circle\nsquare\n")
    with pytest.raises(DatasetLayoutError, match=r"has 3 class sub-folders .* lists 2 class names"):
        read_dataset("mismatch", tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"group": "paper-ish"}, "group 'paper-ish'; expected one of ood, cross_domain, other"),
    ({"templates": ("no slot",)}, "exactly one '{}'"),
    ({"reader": "not a function"}, "expected a function, 'module:function' or a built-in reader's name"),
    ({"num_classes": 0}, "num_classes 0"),
    ({"paper": True}, "a paper dataset belongs to group"),
])
def test_a_card_is_checked_when_made(change, message):
    fields = dict(name="mine", title="Mine", group="other", num_classes=2, test_images=None, folder="mine",
                  layout="mine/...", reader="m:f", templates=("{}",))
    with pytest.raises(ValueError, match=message):
        DatasetCard(**{**fields, **change})


def test_registering_refuses_a_taken_spelling_or_the_paper_flag():
    with pytest.raises(ValueError, match="the spelling 'Sketch' already names dataset 'imagenet-sketch'"):
        registry.register_dataset(DatasetCard("sketchy", "Sketch", "other", 2, None, "sketchy", "-", "m:f", ("{}",)))
    with pytest.raises(ValueError, match="paper=True is for the paper's datasets"):
        registry.register_dataset(DatasetCard("mine2", "Mine2", "ood", 2, None, "mine2", "-", "m:f", ("{}",),
                                              paper=True))
    assert "sketchy" not in registry.DATASETS and "mine2" not in registry.DATASETS


def test_a_folder_with_a_broken_file_is_a_spec_error_naming_it(tmp_path):
    from orchestrator.sweep.load import SpecError, validate_spec

    folder = write_folder_dataset(tmp_path / "data", name="broken_shapes")
    (folder / "templates.txt").unlink()
    spec = {"name": "s", "results_dir": "r", "cache_dir": "c", "data_root": "data", "datasets": ["broken_shapes"],
            "backbones": [{"model": "RN50", "pretrained": "random"}], "methods": [{"method": "clip"}], "seeds": [1]}
    with pytest.raises(SpecError, match=r"datasets\[0\]: dataset folder .*broken_shapes: templates.txt is missing"):
        validate_spec(spec, base_dir=tmp_path)


READ_BACK = '''
import json, sys
from orchestrator.results.db import ResultsDB
from orchestrator.results import report
db = ResultsDB(sys.argv[1])
tables = report.report_tables(db)
print(json.dumps([[t.title, t.columns] for t in tables]))
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_folder_and_plugin_datasets_through_sweep_report_and_dashboard(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    data = tmp_path / "data"
    write_folder_dataset(data)
    write_csv_dataset(data)
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "toy_dataset_plugin.py").write_text(PLUGIN)
    config = write_model_config(TINY_VIT, tmp_path / "models")
    spec = tmp_path / "toys.yaml"
    spec.write_text(json.dumps({
        "name": "toys", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
        "plugins": ["toy_dataset_plugin"],
        "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
        "datasets": ["toyshapes", "toycsv"],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3, "n1": 10}],
        "seeds": [1], "resources": {"cpus": 1}, "part_rows": 5,
    }))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugin"), str(REPO)])}
    env.pop("BCA_PLUGINS", None)
    sweep = subprocess.run([BCA, "sweep", str(spec)], env=env, capture_output=True, text=True, timeout=500)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert "4/4 runs finished" in sweep.stdout
    # the end-of-sweep table: both datasets as columns (the folder by its name, the card by its title)
    header = next(line for line in sweep.stdout.splitlines() if "┃ backbone" in line)
    assert "Toy CSV" in header and "toyshapes" in header, sweep.stdout

    results = tmp_path / "results"
    report = subprocess.run([BCA, "report", "--results", str(results)], env=env, capture_output=True, text=True,
                            timeout=200)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "Other datasets" in report.stdout and "toyshapes" in report.stdout and "toycsv" in report.stdout
    assert "Table 1" not in report.stdout and "Table 2" not in report.stdout
    read = subprocess.run([sys.executable, "-c", READ_BACK, str(results)], env={**env, "BCA_PLUGINS": "toy_dataset_plugin"},
                          capture_output=True, text=True, timeout=200)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == [["Other datasets, by method and dataset, top-1 accuracy (%)",
                                        ["Toy CSV", "toyshapes", "Average"]]]

    monkeypatch.setenv(RESULTS_ENV, str(results))
    at = AppTest.from_file(str(APP_PATH), default_timeout=180).run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.table[0].value
    assert {"toyshapes", "toycsv"} <= set(table.columns), table.columns
    assert table.drop(columns="configuration").notna().all().all()
