"""No number without its evidence (issue 24): each table cell says how many runs it stands on and whether some are
missing or incomplete, short of samples, paired with CLIP on the same runs, and compared only within its stream
protocol; a published number is set beside a complete dataset only."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from orchestrator.results import report
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results, write_fake_run
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.progress import summary_table


def _config(method: str, seed: int, dataset: str = "imagenet", stream=None, order=None, hparams=None) -> dict:
    config = {"sweep": "s", "backbone": "RN50", "pretrained": "openai", "dataset": dataset, "method": method,
              "seed": seed, "templates": "ensemble7", "num_templates": 1, "views": "1",
              "hparams": hparams if hparams is not None else ({"tau": 0.3} if method == "bca" else {})}
    if stream is not None:
        config["stream"] = stream
    if order is not None:
        config["order_index"] = order
    return config


def _by_seed(runs, method):
    return {r.config["seed"]: r.accuracy for r in runs if r.config["method"] == method}


def test_stopped_sweep_gain_is_paired_and_cells_count_their_runs(tmp_path):
    """24.2: a Ctrl-C'd 3-seed sweep: CLIP has 3 seeds, BCA 2 finished, 1 interrupted, and (another setting) 1
    that never started. The gain is BCA minus CLIP on the same 2 seeds, and the cell says 2 of 3."""
    runs = [write_fake_run(tmp_path, _config("clip", s), n=60, accuracy=0.5 + 0.1 * s) for s in (1, 2, 3)]
    runs += [write_fake_run(tmp_path, _config("bca", s), n=60, accuracy=0.7) for s in (1, 2)]
    write_fake_run(tmp_path, _config("bca", 3), n=60, rows=20, status="failed")  # interrupted
    table = report.build_table(ResultsDB(tmp_path), report.generic_layout(["imagenet"]))
    clip, bca = _by_seed(runs, "clip"), _by_seed(runs, "bca")
    paired = np.mean([bca[s] - clip[s] for s in (1, 2)])
    unpaired = np.mean(list(bca.values())) - np.mean(list(clip.values()))
    assert not math.isclose(paired, unpaired)
    key = ("RN50", "BCA")
    assert math.isclose(table.gain.at[key, "ImageNet"], paired)
    assert table.n.at[key, "ImageNet"] == 2 and table.expected.at[key, "ImageNet"] == 3
    assert table.gain_n.at[key, "ImageNet"] == 2
    text = table.formatted()
    assert text.at[key, "ImageNet"].endswith("(n=2 of 3)")
    assert text.at[key, "Δ CLIP (ImageNet)"].startswith(f"{paired:+.2f} (n=2 of 3) [")  # then its interval
    assert text.at[("RN50", "CLIP"), "ImageNet"].endswith("(n=3)")
    assert any("seed 3, order 0: failed (RuntimeError: injected failure (fake run))" in n for n in table.notes)
    # an incomplete cell is never "best"
    assert not table.best.at[key, "ImageNet"] and table.best.at[("RN50", "CLIP"), "ImageNet"]


def test_a_run_that_never_started_still_counts_as_missing(tmp_path):
    for s in (1, 2, 3):
        write_fake_run(tmp_path, _config("clip", s), n=40)
    for s in (1, 2):
        write_fake_run(tmp_path, _config("bca", s), n=40)
    table = report.build_table(ResultsDB(tmp_path), report.generic_layout(["imagenet"]))
    assert table.formatted().at[("RN50", "BCA"), "ImageNet"].endswith("(n=2 of 3)")
    assert any("seed 3, order 0: never ran" in n for n in table.notes)


def test_truncated_part_marks_the_cell_in_report_and_sweep_summary(tmp_path):
    """24.3: a truncated part of one run: `bca report`'s cell and the end-of-sweep table say 2 of 3 and name the
    run's state instead of quietly averaging what is left."""
    runs = make_fake_results(tmp_path, sweep="s", datasets=("synthetic-a",), seeds=(1, 2, 3), n=80, part_size=40)
    victim = next(r for r in runs if r.config["method"] == "bca" and r.config["seed"] == 2)
    part = next(tmp_path.glob(f"samples/**/run_id={victim.run_id}/part-*.parquet"))
    part.write_bytes(part.read_bytes()[:300])
    table = report.method_dataset_table(tmp_path)
    cell = table.formatted().at[("RN50", "BCA"), "synthetic-a"]
    survivors = [r.accuracy for r in runs if r.config["method"] == "bca" and r is not victim]
    assert cell == f"{np.mean(survivors):.2f} ± {np.std(survivors, ddof=1):.2f} (n=2 of 3)"
    assert any("seed 2, order 0: finished but 40 of 80 rows readable" in n for n in table.notes)
    text = " ".join(summary_table(str(tmp_path), "s").split())
    assert "(n=2 of 3)" in text and "finished but 40 of 80 rows readable" in text


def test_skipped_images_show_in_the_cell_and_keep_it_from_the_paper(tmp_path):
    """24.1: runs that skipped images say '30 of 40 samples'; a published number is compared only with a cell on
    the complete dataset (the card's image count, nothing skipped, every run)."""
    for method in ("clip", "bca"):
        write_fake_run(tmp_path, _config(method, 1, dataset="eurosat"), n=30, part_size=30)
        RunWriter(tmp_path, _config(method, 1, dataset="eurosat")).mark(
            "finished", n_skipped=10, skipped=json.dumps([{"image_id": f"River/{i}.png", "reason": "unreadable"}
                                                          for i in range(10)]))
    for method in ("clip", "bca"):  # DTD complete: 1,692 test images
        write_fake_run(tmp_path, _config(method, 1, dataset="dtd"), n=1692, part_size=1692, save_state=False)
    table = report.build_table(ResultsDB(tmp_path), report.TABLE2, paper=True)
    text = table.formatted()
    assert text.at[("RN50", "BCA", "measured"), "EuroSAT"].endswith("(n=1; 30 of 40 samples)")
    assert math.isnan(table.mean.at[("RN50", "BCA", "Δ paper"), "EuroSAT"])
    assert text.at[("RN50", "BCA", "Δ paper"), "EuroSAT"] == "—"
    published = table.mean.at[("RN50", "BCA", "paper"), "DTD"]
    assert math.isclose(table.mean.at[("RN50", "BCA", "Δ paper"), "DTD"],
                        table.mean.at[("RN50", "BCA", "measured"), "DTD"] - published)
    assert any("EuroSAT: 30 of 40 samples" in n for n in table.notes)
    assert any(n.startswith("Δ paper left out of") for n in table.notes)


@pytest.mark.parametrize("orders", [1, 3])
def test_best_is_per_stream_protocol_and_the_caption_names_the_spread(tmp_path, orders):
    """24.7: OnZeta on a contaminated stream is not 'best' against BCA on an i.i.d. one; the caption says whether
    the ± is over seeds or over orders."""
    seeds = (1, 2) if orders == 1 else (1,)
    contaminated = json.dumps({"contaminated": {"rate": 0.2}})
    for seed in seeds:
        for order in range(orders):
            o = order if orders > 1 else None
            write_fake_run(tmp_path, _config("clip", seed, "synthetic-x", "iid", o), n=50, accuracy=0.5)
            write_fake_run(tmp_path, _config("bca", seed, "synthetic-x", "iid", o), n=50, accuracy=0.6)
            write_fake_run(tmp_path, _config("clip", seed, "synthetic-x", contaminated, o, {}), n=50, accuracy=0.7)
            write_fake_run(tmp_path, _config("onzeta", seed, "synthetic-x", contaminated, o, {}), n=50,
                           accuracy=0.9)
    table = report.method_dataset_table(tmp_path)
    best = table.best["synthetic-x"]
    bold = sorted(k[1] for k in best.index if best[k])
    assert bold == ["BCA (stream=iid)", "OnZeta (stream=contaminated(rate=0.2))"]
    spread = "stream orders (one seed)" if orders > 1 else "seeds"
    assert table.notes[0].startswith(f"mean ± std over {spread};")


def test_a_sweep_over_a_dataset_with_deleted_images_says_so(tmp_path):
    """24.1 as the issue met it: a class's images deleted from a real-layout EuroSAT, the sweep runs (the images
    are recorded as skipped); the end-of-sweep table, `bca report` and the paper table say the cell stands on
    fewer samples than the dataset has, and no published number is compared with it."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config
    from orchestrator.sweep.load import validate_spec
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.trial import execute_trial

    folder = build_dataset("eurosat", tmp_path / "data", num_classes=4, per_class=3)
    doomed = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".jpg", ".png", ".jpeg"))[:3]
    for path in doomed:
        path.unlink()
    config = write_model_config(TINY_VIT, tmp_path / "models")
    spec = validate_spec({"name": "skips", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
                          "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
                          "datasets": ["eurosat"], "methods": [{"method": "clip"}, {"method": "bca"}],
                          "seeds": [1], "part_rows": 4}, base_dir=tmp_path)
    for trial in make_trials(expand(spec), 1):
        execute_trial(trial, settings_of(spec))
    results = tmp_path / "results"
    summary = " ".join(summary_table(str(results), "skips").split())
    assert "(n=1; 9 of 12 samples)" in summary and "EuroSAT: 9 of 12 samples (unreadable images skipped)" in summary
    table = report.build_table(ResultsDB(results), report.TABLE2, paper=True)
    measured = [k for k in table.mean.index if k[2] == "measured" and not math.isnan(table.mean.at[k, "EuroSAT"])]
    assert len(measured) == 2 and all(table.formatted().at[k, "EuroSAT"].endswith("(n=1; 9 of 12 samples)")
                            for k in measured)
    assert table.mean.xs("Δ paper", level="source")["EuroSAT"].isna().all()


@pytest.mark.parametrize("duplicates", [False, True])
def test_cell_values_equal_the_plain_pooled_means(duplicates):
    """A cell's per-(seed, order) values, read in one pass when each key has one run, equal the plain computation
    (every usable run's value appended per key, then sum / count), bit for bit: -0.0, NaN and unusable runs
    included."""
    import pandas as pd

    from orchestrator.results import evidence

    rng = np.random.default_rng(3)
    keys = [(s, o) for s in range(6) for o in range(3)]
    rows = keys + (keys[:7] if duplicates else [])
    order = rng.permutation(len(rows))
    seeds = np.array([rows[i][0] for i in order])
    orders = np.array([rows[i][1] for i in order])
    values = rng.normal(60, 5, len(rows))
    values[0], values[1] = -0.0, math.nan
    runs = pd.DataFrame({"run_id": [f"r{i}" for i in range(len(rows))], "sweep": "s", "backbone": "RN50",
                         "dataset": "synthetic-a", "method": "bca", "seed": seeds, "order_index": orders,
                         "status": ["failed" if i == 2 else "finished" for i in range(len(rows))],
                         "complete": True, "n_samples": 100, "n_skipped": 0, "stream": None})
    frame = evidence.prepare(runs)
    cell = evidence.cell_at(frame, evidence.columns(frame), values, np.arange(len(frame)),
                            evidence.expected_keys(frame))
    pooled: dict[tuple[int, int], list[float]] = {}
    for i in range(len(rows)):
        if frame["_fit"].iloc[i] and not math.isnan(values[i]):
            pooled.setdefault((int(seeds[i]), int(orders[i])), []).append(float(values[i]))
    plain = {k: sum(v) / len(v) for k, v in sorted(pooled.items())}
    assert list(cell.values.items()) == list(plain.items())
    assert all(math.copysign(1, cell.values[k]) == math.copysign(1, plain[k]) for k in plain)
    assert cell.stats() == (float(np.mean(list(plain.values()))), float(np.std(list(plain.values()), ddof=1)),
                            len(plain))
