"""Prompt tuning in a sweep as a user meets it: the dry run says which methods run CLIP's text encoder at test time
and what they need (RLCF: its teacher's cache entry and memory), a synthetic dataset is refused for them (exit 2,
naming the method and why), and TPT, C-TPT, R-TPT, O-TPT, A-TPT and RLCF (its teacher another tiny open_clip model)
run in a Ray sweep on a real-layout image dataset with the tiny open_clip model, their rows in `bca report` and the
dashboard beside zero-shot CLIP, and DynaPrompt and HisTPT (online) with them; the online methods' streams are refused
shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.testing import TINY_RN, TINY_VIT, build_dataset, write_model_config

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


def real_spec(tmp_path: Path, **overrides) -> Path:
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=3)
    spec = {"name": "prompt", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "pretrained": "random",
                           "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
            "datasets": ["dtd"], "views": "augmix9", "methods": [{"method": "clip"}, {"method": "tpt"}],
            "seeds": [1], "resources": {"cpus": 1}, "part_rows": 4, **overrides}
    path = tmp_path / "prompt.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_dry_run_shows_the_text_encoder_and_its_memory(tmp_path):
    r = bca("sweep", str(real_spec(tmp_path)), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "methods running CLIP's text encoder at test time" in r.stdout
    assert "tpt on dtd: CLIP's text encoder at test time, wants a GPU, 18.2 MB per class per sample (~0.8 GB at K " \
           "= 47)" in r.stdout
    assert "methods[1].method: 'tpt' runs CLIP's text encoder forward and backward for every sample and wants a GPU " \
           "(18.2 MB per class per sample); resources.gpu is 0, so its trials run on the CPU" in r.stderr


def test_dry_run_shows_the_teachers_cache_entry_cost_and_memory_and_refuses_a_bad_teacher(tmp_path, monkeypatch):
    """RLCF's teacher is a second backbone read through the feature cache: its entry is listed and priced beside the
    student's, with the memory its features take in the trial; a teacher that is not a registered CLIP backbone, or
    whose published weights are not on this machine, exits 2 naming the entry."""
    import huggingface_hub.constants

    r = bca("sweep", str(real_spec(tmp_path, methods=[{"method": "clip"},
                                                      {"method": "rlcf", "teacher": TINY_RN}])), "--dry-run")
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert f"{TINY_VIT} random weights dtd views=augmix9 seed=1: to encode" in out
    assert f"{TINY_RN} random weights dtd views=augmix9 seed=1: to encode" in out
    assert (f"rlcf on dtd: teacher {TINY_RN} (random weights), 9 samples x 10 views x 64 float32 = 0.02 MB in the "
            f"trial") in out
    assert "180 image views to encode" in out  # the student's 9 x 10 and the teacher's
    r = bca("sweep", str(real_spec(tmp_path, methods=[{"method": "rlcf", "teacher": ["ViT-H-14", TINY_RN]}])),
            "--dry-run")
    assert r.exit_code == 2, r.output
    assert "methods[0].teacher[0]: rlcf: hparam 'teacher' must be one of ['RN50', 'ViT-B-16', 'ViT-B-32', " \
           "'ViT-L-14', 'bca-tiny-vit', 'bca-tiny-rn']" in " ".join(r.stderr.split())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # ~/.cache/clip, where OpenAI's files go
    r = bca("sweep", str(real_spec(tmp_path, methods=[{"method": "rlcf"}])), "--dry-run")
    assert r.exit_code == 2, r.output
    assert "methods[0].teacher: rlcf's teacher: weights for model 'ViT-L-14' with tag 'openai' are not on this " \
           "machine" in " ".join(r.stderr.split())


def test_a_synthetic_dataset_is_refused_for_prompt_tuning(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "s", "results_dir": "results", "datasets": [{"synthetic": "label_shift", "n": 60, "num_classes": 4,
                                                              "dim": 16}],
        "views": "augmix7", "methods": [{"method": "tpt"}], "seeds": [1]}))
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 2
    assert "methods[0].method" in r.stderr and "'tpt' tunes the prompt through CLIP's text encoder at test time, " \
           "and the synthetic dataset 'synthetic-label_shift' has generated embeddings only" in r.stderr
    assert not (tmp_path / "results").exists()


def test_views_whose_selection_is_empty_are_refused(tmp_path):
    """int(V * keep) views feed the loss, as the official code counts them: at keep 0.1, 8 views (augmix7) select
    none, so the entry exits 2 naming where; a larger keep runs, and so does the same keep with 10 views."""
    r = bca("sweep", str(real_spec(tmp_path, views="augmix7", methods=[
        {"method": "clip"}, {"method": "tpt"}, {"method": "rtpt", "keep": [0.1, 0.125]}, {"method": "dynaprompt"}])),
        "--dry-run")
    assert r.exit_code == 2, r.output
    assert ("methods[1].method: on dtd with views augmix7: tpt: keep 0.1 of 8 views selects int(8 * 0.1) = 0 views "
            "for the loss, where the official code (select_confident_samples) takes a NaN loss and leaves the prompt "
            "untuned; expected V * keep >= 1: at keep 0.1 at least 10 views (the official protocol has 64), or a "
            "larger keep") in " ".join(r.stderr.split())
    assert "methods[2].keep[0]: on dtd with views augmix7: rtpt: keep 0.1" in " ".join(r.stderr.split())
    assert "methods[2].keep[1]" not in r.stderr and "methods[3].method: on dtd" in r.stderr
    assert not (tmp_path / "results").exists()
    assert bca("sweep", str(real_spec(tmp_path, methods=[{"method": "tpt"}])), "--dry-run").exit_code == 0


def test_the_online_methods_streams_are_refused_shards(tmp_path):
    """DynaPrompt's buffer and HisTPT's prompt and memories carry from sample to sample: `shards: 2` exits 2 naming
    the entry; TPT's is planned."""
    r = bca("sweep", str(real_spec(tmp_path, methods=[{"method": "tpt", "shards": 2},
                                                      {"method": "dynaprompt", "shards": 2},
                                                      {"method": "histpt", "shards": 2}])), "--dry-run")
    assert r.exit_code == 2, r.output
    assert "methods[1].shards: 'dynaprompt' carries its state from sample to sample" in r.stderr
    assert "methods[2].shards: 'histpt' carries its state from sample to sample" in r.stderr
    assert "methods[0].shards" not in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_prompt_tuning_methods_run_in_a_sweep_and_report_beside_clip(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    path = real_spec(tmp_path, methods=[{"method": m} for m in ("clip", "tpt", "ctpt", "rtpt", "otpt", "atpt",
                                                                  "dynaprompt", "histpt")]
                     # RLCF in two shards (episodic): each reads its rows of the teacher's features
                     + [{"method": "rlcf", "teacher": TINY_RN, "shards": 2}])
    r = bca("sweep", str(path), "--yes")
    assert r.exit_code == 0, r.output
    assert "9/9 runs finished, 0 failed" in r.stdout
    results = str(tmp_path / "results")
    report = bca("report", "--results", results)
    assert report.exit_code == 0, report.output
    assert all(label in report.stdout for label in ("CLIP", "TPT", "C-TPT", "R-TPT", "O-TPT", "A-TPT", "DynaPrompt",
                                                    "HisTPT", "RLCF"))
    rows = bca("query", "--results", results, "SELECT method, count(*) AS n FROM samples GROUP BY method ORDER BY method")
    assert rows.exit_code == 0, rows.output
    cells = [[c.strip() for c in ln.split("│")[1:3]] for ln in rows.stdout.splitlines() if ln.startswith("│")]
    assert [c for c in cells if c[0] != "method"] == [["atpt", "9"], ["clip", "9"], ["ctpt", "9"], ["dynaprompt", "9"],
                                                      ["histpt", "9"], ["otpt", "9"], ["rlcf", "9"], ["rtpt", "9"],
                                                      ["tpt", "9"]]
    # the teacher's features were encoded once, as an entry of the feature cache beside the student's
    backbones = sorted(json.loads(p.read_text())["backbone"] for p in (tmp_path / "cache").glob("features/*/manifest.json"))
    assert backbones == [f"{TINY_RN}/random", f"{TINY_VIT}/random"]
    monkeypatch.setenv(RESULTS_ENV, results)
    at = AppTest.from_file(str(APP_PATH), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(str(v) for t in at.table for v in t.value.to_numpy().ravel())
    assert all(label in shown for label in ("TPT", "C-TPT", "R-TPT", "O-TPT", "A-TPT", "DynaPrompt", "HisTPT", "RLCF"))
