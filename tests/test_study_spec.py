"""experiments/paper_study.yaml (the paper's Tables 1-2 grid over 100 orders) plans with the documented dry run on a
machine without its data or weights, and prints the projected CPU- and GPU-hours of the cost model, whose GPU
rates are the H100 log's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.methods.episodic import order_free
from orchestrator.registry import method_cards, method_card, paper_datasets
from orchestrator.sweep import cost
from orchestrator.sweep.load import SpecError, load_spec
from tests.dashboard_results import bca_executable

REPO = Path(__file__).resolve().parents[1]


def test_the_study_spec_is_the_papers_grid_over_100_orders():
    spec = load_spec(REPO / "experiments/paper_study.yaml", data_elsewhere=True)
    assert sorted(d.name for d in spec.datasets) == sorted(paper_datasets())
    assert [b.model for b in spec.backbones] == ["RN50", "ViT-B-16"] and spec.orders == 100
    # every built-in method adapting on CLIP's features (RLCF's teacher is a CLIP backbone at its published weights)
    # but COSMIC, which also reads DINOv2's, whose weights the spec would have to name
    builtin = {c.name for c in method_cards() if isinstance(c.impl, str) and c.impl.startswith("orchestrator.")
               and c.image_encoder is None and not c.auxiliary}
    assert {m.method for m in spec.methods} == builtin


def written_under(*roots: Path) -> dict[Path, int]:
    """Every path under the roots (the roots included) with its modification time: what a command wrote there."""
    return {p: p.stat().st_mtime_ns for root in roots if root.exists() for p in [root, *root.rglob("*")]}


def test_the_documented_dry_run_plans_the_study_without_its_data(tmp_path):
    assert not (REPO / "data").exists()  # the spec's data_root: absent on a test machine
    # the spec's results and cache dirs: the demo (the README's first command) may have written there before
    before = written_under(REPO / "results", REPO / "cache")
    done = subprocess.run([bca_executable(), "sweep", "experiments/paper_study.yaml", "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # 31 methods on 15 datasets and Zero on the 4 AugMix variants, 2 backbones, 100 orders
    assert "sweep paper_study (dry run: nothing is run or written): 93,800 runs, 0 finished" in out
    assert "is not on this machine: planned for the machine that holds it" in out
    # packs sized by the spec's GPU memory (resources.gpu_memory_gb), not by CPU time (35,668 trials, most of one
    # run, whose orders a GPU would then step one at a time)
    assert "memory is not known here" not in out
    assert int(re.search(r"to run in ([\d,]+) trials", out)[1].replace(",", "")) < 1000
    steps = int(re.search(r"estimated cost: ([\d,]+) online steps", out)[1].replace(",", ""))
    cpu = float(re.search(r"projected CPU-hours: ([\d,.]+)", out)[1].replace(",", ""))
    projected = re.search(r"projected GPU-hours: ([\d,.]+) \(one H100: methods ([\d,.]+), lockstep packs of 32 "
                          r"configs where a method has a runner, rates from (.*?)(?:; at CPU rates: ([a-z_, ]+))?; "
                          r"encoding ([\d,.]+), ([\d,]+) image views at the image encoders' fp16 rates from (\S+)\)$",
                          out, re.M)
    total, gpu, encoding = (float(projected[i].replace(",", "")) for i in (1, 2, 5))
    assert projected[3] == " and ".join(cost.GPU_RATES_LOGS) and projected[7] == cost.GPU_RATES_LOGS[0]
    # the methods with no H100 rate yet are named, not silently priced at the H100's
    spec_methods = {m["method"] for m in yaml.safe_load((REPO / "experiments/paper_study.yaml").read_text())["methods"]}
    unrated = sorted(m for m in spec_methods if method_card(m).cost.gpu_samples_per_s is None)
    assert (projected[4] or "") == ", ".join(unrated)
    # the images to encode (none cached: the data is elsewhere) are priced at the encoders' measured rates
    views = int(re.search(r"([\d,]+) image views to encode", out)[1].replace(",", ""))
    assert int(projected[6].replace(",", "")) == views and encoding > 0
    assert total == pytest.approx(gpu + encoding, abs=0.15)  # three figures, each printed to 0.1
    rates = [cost.GPU_ENCODER_IMAGES_PER_S[m] for m in ("RN50", "ViT-B-16", "ViT-L-14")]  # RLCF's teacher: ViT-L/14
    assert views / min(rates) / 3600 > encoding > views / max(rates) / 3600
    # every run streams its dataset's whole test split: the registry's sizes, 100 orders, both backbones; an
    # order-free method's configuration is computed once for its 100 orders (orchestrator.sweep.replay)
    free = sorted(m for m in spec_methods if order_free(m))
    assert free == ["atpt", "ctpt", "mta", "otpt", "rlcf", "rtpt", "tps", "tpt", "zero"]
    orders = {m: 1 if m in free else 100 for m in spec_methods}
    entries = yaml.safe_load((REPO / "experiments/paper_study.yaml").read_text())["methods"]
    replayed = sum(2 * 100 * len(m.get("datasets", paper_datasets())) for m in entries if m["method"] in free)
    assert f"order-free runs computed once over their orders: {replayed:,} runs of " in out
    samples = {m["method"]: sum(2 * orders[m["method"]] * _test_images(d) for d in m.get("datasets", paper_datasets()))
               for m in entries}
    assert steps == sum(samples.values())
    # each method's samples at its H100 rate (every method of the spec has one)
    rate = {m: method_card(m).cost.gpu_samples_per_s or method_card(m).cost.samples_per_s or cost.UNKNOWN_SAMPLES_PER_S
            for m in samples}
    expected = sum(count / rate[m] for m, count in samples.items()) / 3600
    assert gpu == pytest.approx(expected, abs=0.05) and cpu > 0
    assert written_under(REPO / "results", REPO / "cache") == before  # a dry run writes nothing


def _test_images(dataset: str) -> int:
    from orchestrator.registry import dataset_card

    return dataset_card(dataset).test_images


def test_a_missing_data_root_still_refuses_a_sweep_that_would_run_here(tmp_path):
    try:
        load_spec(REPO / "experiments/paper_study.yaml")
    except SpecError as exc:
        assert "data_root: directory" in str(exc) and "does not exist" in str(exc)
    else:
        raise AssertionError("a sweep run here needs its data_root")


def test_encoder_rates_are_the_h100_log():
    log = (REPO / cost.GPU_RATES_LOGS[0]).read_text().split("3. image encoders")[1]
    measured = {m: float(r.replace(",", "")) for m, r in re.findall(r"^  (\S+) +([\d,]+) images/s", log, re.M)}
    assert measured == cost.GPU_ENCODER_IMAGES_PER_S


def test_the_projection_prices_encoding_per_backbone_and_names_an_unmeasured_one():
    cpu, gpu = cost.projected_hours([], lambda source: 0, {"RN50": 4612 * 3600, "ViT-B/16": 6378 * 1800,
                                                         "ViT-H-14": 1000})
    assert "projected GPU-hours: 1.5 (one H100: methods 0.0," in gpu
    assert "encoding 1.5, 28,084,600 image views" in gpu and "not priced for ViT-H-14 (no measured rate)" in gpu
    assert "the 28,084,600 image views to encode are not in it" in cpu


def test_gpu_rates_are_the_h100_logs():
    """A card's gpu_samples_per_s is its method's H100 figure in the logs: the G = 32 lockstep column where the
    method has a runner, else the single-stream one; prompt tuning's s/sample through the ViT-B/16 text tower."""
    table, prompt, pack = {}, {}, None
    for name in cost.GPU_RATES_LOGS:
        log = (REPO / name).read_text()
        for line in log.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 8 and cells[1][:1].isdigit():
                rate = cells[5] if cells[5][:1].isdigit() else cells[1]
                table[cells[0]] = float(rate.split()[0].replace(",", ""))
        tower = log.split("ViT-B-16 text tower")[1:]
        for name_, seconds in re.findall(r"^    (\w+) +chunked ([\d.]+) s/sample", tower[0] if tower else "", re.M):
            prompt.setdefault(name_, round(1 / float(seconds), 2))
        found = re.search(r"32 bca configs x 2000 samples .*?, ([\d,]+) cfg-samples/s", log)
        pack = pack or (found and float(found[1].replace(",", "")))
    rated = {c.name: c.cost.gpu_samples_per_s for c in method_cards() if c.cost.gpu_samples_per_s is not None}
    for method, rate in rated.items():
        expected = pack if method in ("clip", "la", "pa", "bca") else \
            prompt.get(method, table.get(method_card(method).label))
        assert rate == expected, method
    # every method of the logs has its rate on its card
    assert {c.label for c in method_cards() if c.name in rated} >= set(table) - {"CLIP", "CLIP+LA", "CLIP+PA", "BCA"}
    assert set(rated) >= set(prompt)
