"""docs/adding-a-dataset.md as a user follows it: its files (the two text files, the spec, the plugin module)
written from its code blocks, its images drawn in the layout it shows, then its shell commands run verbatim.
One change: the spec's backbone is the tiny test model (no weights can be fetched here)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.clip.testing import TINY_VIT, write_image, write_model_config

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding-a-dataset.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_guide_runs_as_written(tmp_path):
    classnames, templates = blocks("text")
    spec = yaml.safe_load(blocks("yaml")[0])
    spec["backbones"] = [{"model": TINY_VIT, "pretrained": "random",
                          "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}]
    (tmp_path / "toys.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "my_datasets.py").write_text(blocks("python")[0])
    shapes = tmp_path / "data" / "toyshapes"
    for label, name in enumerate(classnames.split()):
        for i in range(3):
            write_image(shapes / f"{label}_{name}" / f"{i}.png", label, i)
    (shapes / "classnames.txt").write_text(classnames)
    (shapes / "templates.txt").write_text(templates)
    lines = []
    for label, name in enumerate(["cat", "dog"]):
        for i in range(4):
            write_image(tmp_path / "data" / "toy_csv" / "img" / f"{name}{i}.jpg", label + 3, i)
            lines.append(f"img/{name}{i}.jpg,{name}")
    (tmp_path / "data" / "toy_csv" / "labels.csv").write_text("\n".join(lines) + "\n")

    (commands,) = blocks("bash")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("BCA_PLUGINS", None)
    run = subprocess.run(["bash", "-e", "-c", commands], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=560)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "sweep toys (dry run: nothing is run or written): 4 runs" in out
    assert "4/4 runs finished, 0 failed" in out
    header = next(line for line in out.splitlines() if "┃ backbone" in line)
    assert "Toy CSV" in header and "toyshapes" in header
    assert "Other datasets, by method and dataset" in out
