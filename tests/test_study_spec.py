"""experiments/paper_study.yaml (the paper's Tables 1-2 grid over 100 orders) plans with the documented dry run on a
machine without its data or weights, and prints the projected CPU- and GPU-hours of the cost model, whose GPU
rates are the H100 log's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from orchestrator.registry import method_cards, method_card, paper_datasets
from orchestrator.sweep import cost
from orchestrator.sweep.load import SpecError, load_spec
from tests.dashboard_results import bca_executable

REPO = Path(__file__).resolve().parents[1]


def test_the_study_spec_is_the_papers_grid_over_100_orders():
    spec = load_spec(REPO / "experiments/paper_study.yaml", data_elsewhere=True)
    assert sorted(d.name for d in spec.datasets) == sorted(paper_datasets())
    assert [b.model for b in spec.backbones] == ["RN50", "ViT-B-16"] and spec.orders == 100
    builtin = {c.name for c in method_cards() if isinstance(c.impl, str) and c.impl.startswith("orchestrator.")}
    assert {m.method for m in spec.methods} == builtin  # every built-in method


def test_the_documented_dry_run_plans_the_study_without_its_data(tmp_path):
    assert not (REPO / "data").exists()  # the spec's data_root: absent on a test machine
    done = subprocess.run([bca_executable(), "sweep", "experiments/paper_study.yaml", "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # 21 methods on 15 datasets and Zero on the 4 AugMix variants, 2 backbones, 100 orders
    assert "sweep paper_study (dry run: nothing is run or written): 63,800 runs, 0 finished" in out
    assert "is not on this machine: planned for the machine that holds it" in out
    steps = int(re.search(r"estimated cost: ([\d,]+) online steps", out)[1].replace(",", ""))
    cpu = float(re.search(r"projected CPU-hours: ([\d,.]+)", out)[1].replace(",", ""))
    projected = re.search(r"projected GPU-hours: ([\d,.]+) \(one H100, lockstep packs of 32 configs, rates from "
                          r"benchmarks/logs/gpu-h100-2026-11-26.txt; at CPU rates: ([a-z_, ]+)\)", out)
    gpu = float(projected[1].replace(",", ""))
    # the methods with no H100 rate yet are named, not silently priced at the H100's
    assert projected[2] == "ctpt, ecalp, oga, rtpt, stata, tpt, transclip, zlap"
    # every run streams its dataset's whole test split: the registry's sizes, 100 orders, both backbones
    assert steps == sum(2 * 100 * _test_images(d) * (22 if d.startswith("imagenet-") else 21)
                        for d in paper_datasets())
    assert 0 < gpu < cpu
    assert not (REPO / "results").exists()


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


def test_gpu_rates_are_the_h100_logs():
    log = (REPO / cost.GPU_RATES_LOG).read_text()
    table = {}
    for line in log.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[5][:1].isdigit():
            table[cells[0]] = float(cells[5].split()[0].replace(",", ""))
    pack = float(re.search(r"32 bca configs x 2000 samples .*?, ([\d,]+) cfg-samples/s", log)[1].replace(",", ""))
    rated = {c.name: c.gpu_samples_per_s for c in method_cards() if c.gpu_samples_per_s is not None}
    for method, rate in rated.items():
        assert rate == table.get(method_card(method).label, pack if method in ("clip", "la", "pa", "bca") else None), method
    # every method of the log has its rate on its card
    assert {c.label for c in method_cards() if c.name in rated} >= set(table)
