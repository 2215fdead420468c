"""The trial body and progress reporting without Ray: resume from the last complete part is exact, a pack
equals its runs done one by one, failures are recorded, and progress lines and error summaries read well."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from orchestrator.clip import select_views
from orchestrator.methods import make_method
from orchestrator.results import store
from orchestrator.results.schema import SAMPLE_ARROW_SCHEMA, SAMPLES_GLOB
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.progress import ProgressCallback, format_seconds, summarise_error
from orchestrator.sweep.pack import execute_pack
from orchestrator.sweep.pieces import MEMO, load_stream, parse_failpoint, settings_of
from orchestrator.sweep.trial import execute_run, execute_trial

N, PART = 450, 100
SPEC = {
    "name": "trial",
    "results_dir": "results",
    "datasets": [{"synthetic": "temporal", "n": N, "num_classes": 5, "dim": 16}],
    "methods": [{"method": "clip"}, {"method": "bca", "tau": [0.3, 0.6], "n1": 20}, {"method": "tda"}],
    "seeds": [3],
    "part_rows": PART,
}


def spec_in(directory: Path, **overrides):
    return validate_spec({**copy.deepcopy(SPEC), **overrides}, base_dir=directory)


def rows(results_dir: str) -> dict[str, list[dict]]:
    """run_id -> its per-sample rows in stream order, from its live parts and the segments (a pack of fresh runs
    is committed straight into one)."""
    out: dict[str, list[dict]] = {}
    columns = SAMPLE_ARROW_SCHEMA.names
    for path in [*Path(results_dir).glob(SAMPLES_GLOB), *store.load_catalog(results_dir).paths("samples")]:
        for row in pq.read_table(path, columns=columns).to_pylist():
            out.setdefault(row["run_id"], []).append(row)
    return {k: sorted(v, key=lambda r: r["sample_idx"]) for k, v in out.items()}


def run_all(spec, pack: int = 1, failpoint: str | None = None) -> list[dict]:
    settings = settings_of(spec)
    settings = type(settings)(**{**settings.__dict__, "failpoint": failpoint})
    out = []
    for trial in make_trials(expand(spec), pack):
        out += execute_trial(trial, settings)
    return out


def test_a_run_stopped_mid_stream_resumes_exactly(tmp_path):
    reference = spec_in(tmp_path / "ref")
    run_all(reference)
    spec = spec_in(tmp_path / "faulted")
    with pytest.raises(RuntimeError, match="failpoint"):
        run_all(spec, failpoint=f"raise:2:{tmp_path / 'flag'}")
    first = expand(spec)[0]
    row = read_run(spec.results_dir, spec.name, first.run_id)
    assert row["status"] == "failed" and "failpoint" in row["error"]
    assert RunWriter(spec.results_dir, first.config).rows_done() == 2 * PART
    results = run_all(spec)
    assert results[0]["resumed_from"] == 2 * PART and results[0]["rows_written"] == N - 2 * PART
    assert rows(spec.results_dir) == rows(reference.results_dir)
    assert run_all(spec) == []  # everything finished: nothing runs again


def test_a_pack_writes_what_its_runs_write_one_by_one(tmp_path):
    single, packed = spec_in(tmp_path / "single"), spec_in(tmp_path / "packed", pack=4)
    run_all(single)
    results = run_all(packed, pack=4)
    assert len(results) == len(expand(packed)) == 4
    a, b = rows(single.results_dir), rows(packed.results_dir)
    assert a.keys() == b.keys()
    for run_id in a:  # identical rows; probabilities within the engine's float tolerance (other block edges)
        for column in ("confidence", "prob_true"):
            values_a = np.array([r.pop(column) for r in a[run_id]])
            values_b = np.array([r.pop(column) for r in b[run_id]])
            assert np.allclose(values_a, values_b, atol=1e-5)
        assert a[run_id] == b[run_id]


def test_a_pack_of_view_methods_and_view_selecting_methods_on_single_features(tmp_path):
    """On a single-view stream BCA (adaptive view selection: it wants views) takes [n, d] and DOTA (views only)
    [n, 1, d]: one pack holds both, each run given its own kind, rows as run one by one."""
    methods = [{"method": "bca", "n1": 20}, {"method": "dota"}, {"method": "clip"}]
    single = spec_in(tmp_path / "single", methods=methods)
    packed = spec_in(tmp_path / "packed", methods=methods, pack=3)
    run_all(single)
    assert len(run_all(packed, pack=3)) == 3
    a, b = rows(single.results_dir), rows(packed.results_dir)
    assert a.keys() == b.keys() and len(a) == 3
    for run_id in a:
        assert [r["pred"] for r in a[run_id]] == [r["pred"] for r in b[run_id]]


def test_failpoint_strings_are_checked():
    assert parse_failpoint(None) is None
    assert parse_failpoint("sigkill:2:/tmp/flag") == "sigkill:2:/tmp/flag"
    with pytest.raises(ValueError, match="expected '<sigkill|raise|stall>:<parts>:<flag file>'"):
        parse_failpoint("explode:2:/tmp/flag")


ACTOR_DIED = """Failure # 1 (occurred at 2026-11-25_22-05-21)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the process was killed
"""
TRACEBACK = """Failure # 2 (occurred at 2026-11-25_22-05-21)
ray.exceptions.RayTaskError(ValueError): ray::ImplicitFunc.train() (pid=1, ip=1)
  File "x.py", line 1, in f
ValueError: bca: hparam 'tau' must be a number
"""


def test_errors_are_summarised_in_one_line():
    died = summarise_error(ACTOR_DIED)
    assert died.startswith("worker process died") and "SYSTEM_ERROR" in died and "common causes" not in died
    assert summarise_error(TRACEBACK) == "ValueError: bca: hparam 'tau' must be a number"
    assert summarise_error(None) == "unknown error"
    assert format_seconds(75) == "1:15" and format_seconds(3725) == "1:02:05" and format_seconds(float("inf")) == "?"


def test_progress_lines_count_runs_and_report_retries_and_failures(tmp_path):
    spec = spec_in(tmp_path, pack=2)
    runs = expand(spec)
    trials = make_trials(runs, 2)
    lines: list[str] = []
    failed: list[tuple] = []
    callback = ProgressCallback(trials, runs, already_done=0, out=lines.append,
                                on_failed=lambda trial, error: failed.append((trial.key, error)))
    error_file = tmp_path / "error.txt"
    error_file.write_text(ACTOR_DIED)

    def tune_trial(plan, **result):
        return SimpleNamespace(config={"trial": plan.key}, last_result=result, error_file=str(error_file),
                               get_error=lambda: None)

    callback.on_trial_start(0, [], tune_trial(trials[0]))
    callback.on_trial_complete(0, [], tune_trial(trials[0], accuracy=81.5, samples_per_s=1234.0, n_runs=2,
                                                 resumed_from=200))
    callback.on_trial_recover(0, [], tune_trial(trials[1]))
    callback.on_trial_error(0, [], tune_trial(trials[1]))
    assert lines[0].startswith(f"[2/{len(runs)}]") and "acc 81.50% (mean)" in lines[0] and "resumed at row 200" in lines[0]
    assert "ETA" in lines[0]
    assert lines[1].startswith("retry:") and "worker process died" in lines[1]
    assert lines[2].startswith(f"[4/{len(runs)}] FAILED") and failed == [(trials[1].key, summarise_error(ACTOR_DIED))]


def test_a_finished_run_with_a_truncated_part_is_repaired_exactly(tmp_path):
    from orchestrator.sweep.status import INCOMPLETE, run_status

    reference = spec_in(tmp_path / "ref")
    run_all(reference)
    spec = spec_in(tmp_path / "damaged")
    run_all(spec)
    first = expand(spec)[0]
    part = sorted(RunWriter(spec.results_dir, first.config).samples_dir.glob("part-*.parquet"))[2]
    part.write_bytes(part.read_bytes()[:200])  # truncated after the run was marked finished
    assert read_run(spec.results_dir, spec.name, first.run_id)["status"] == "finished"
    status = run_status(spec, expand(spec))
    assert status[first.run_id] == INCOMPLETE and list(status.values()).count("finished") == len(status) - 1
    results = run_all(spec)
    assert [r["run_id"] for r in results] == [first.run_id] and results[0]["resumed_from"] == 2 * PART
    assert rows(spec.results_dir) == rows(reference.results_dir)
    assert set(run_status(spec, expand(spec)).values()) == {"finished"}


def test_deterministic_errors_fail_the_trial_at_once_and_others_are_retried(tmp_path):
    from orchestrator.data.datasets import DatasetLayoutError
    from orchestrator.sweep.trial import deterministic_failure

    spec = spec_in(tmp_path)
    trial = make_trials(expand(spec), 1)[0]
    missing = DatasetLayoutError("DTD: folder /data/dtd does not exist")
    text = deterministic_failure(trial, settings_of(spec), missing)
    assert text.endswith("DatasetLayoutError: DTD: folder /data/dtd does not exist")
    row = read_run(spec.results_dir, spec.name, trial.runs[0].run_id)
    assert row["status"] == "failed" and "DTD: folder /data/dtd does not exist" in row["error"]
    assert deterministic_failure(trial, settings_of(spec), RuntimeError("worker lost")) is None
    assert deterministic_failure(trial, settings_of(spec), OSError(28, "No space left on device")) is None


def test_progress_counts_a_reported_error_as_a_failure(tmp_path):
    spec = spec_in(tmp_path)
    runs = expand(spec)
    trials = make_trials(runs, 1)
    lines, failed = [], []
    callback = ProgressCallback(trials, runs, out=lines.append, on_failed=lambda t, e: failed.append(e))
    trial = SimpleNamespace(config={"trial": trials[0].key}, last_result={"n_runs": 0, "error": "orchestrator.data."
                            "datasets.DatasetLayoutError: DTD: folder /d/dtd does not exist"})
    callback.on_trial_complete(0, [], trial)
    assert callback.errors == {trials[0].key: failed[0]} and "DTD: folder /d/dtd does not exist" in failed[0]
    assert lines[0].startswith(f"[1/{len(runs)}] FAILED")


def test_runs_record_their_image_list_and_a_changed_dataset_is_named_then_rerun(tmp_path):
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_image, write_model_config
    from orchestrator.sweep.catalog import dataset_listing, listing_fingerprint
    from orchestrator.sweep.status import changed_data, run_status

    data = tmp_path / "data"
    build_dataset("imagenet-a", data, num_classes=2, per_class=2)
    spec = validate_spec({
        "name": "real", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
        "backbones": [{"model": TINY_VIT, "pretrained": "random",
                       "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
        "datasets": [{"name": "imagenet-a", "views": "single"}], "methods": [{"method": "clip"}], "seeds": [1],
    }, base_dir=tmp_path)
    run_all(spec)
    (run,) = expand(spec)
    before = listing_fingerprint("imagenet-a", spec.data_root)
    assert read_run(spec.results_dir, spec.name, run.run_id)["data_fingerprint"] == before
    assert changed_data(spec, [run], run_status(spec, [run])) == {}
    folder = next(p for p in (data / "imagenet-adversarial" / "imagenet-a").iterdir() if p.is_dir())
    write_image(folder / "added.jpg", label=0, index=99)  # an image added after the run
    dataset_listing.cache_clear()  # a new `bca sweep` process reads the folder afresh, and new trials too
    MEMO.clear()
    assert listing_fingerprint("imagenet-a", spec.data_root) != before
    assert changed_data(spec, [run], run_status(spec, [run])) == {"imagenet-a": [run]}
    RunWriter(spec.results_dir, run.config).discard_rows()  # what --rerun-changed does before running it
    run_all(spec)
    row = read_run(spec.results_dir, spec.name, run.run_id)
    assert row["n_samples"] == 5 and row["data_fingerprint"] == listing_fingerprint("imagenet-a", spec.data_root)
    assert len(rows(spec.results_dir)[run.run_id]) == 5
def test_views_go_to_the_runs_that_take_them(tmp_path):
    # A stream with augmented views: tda and bca's adaptive view selection get the views [n, V, d]; clip and
    # bca with view_selection='fixed' get the confident-view means, run by run and in a mixed pack alike.
    methods = [{"method": "clip"}, {"method": "bca", "n1": 5, "view_selection": ["adaptive", "fixed"]},
               {"method": "tda"}]
    datasets = [{"synthetic": "temporal", "n": 150, "num_classes": 5, "dim": 16}]
    single, packed = (spec_in(tmp_path / name, methods=methods, datasets=datasets) for name in ("single", "packed"))
    runs = expand(single)
    stream, _ = load_stream(runs[0].source, settings_of(single))
    gen = torch.Generator().manual_seed(0)
    views = torch.cat([stream.features[:, None], stream.features[:, None]
                       + 0.8 * torch.randn(len(stream), 19, stream.features.shape[1], generator=gen)], dim=1)
    views = torch.nn.functional.normalize(views, dim=-1)
    means = select_views(views, stream.class_embeddings, stream.class_ids, stream.num_classes)
    with_views = dataclasses.replace(stream, features=means, view_features=views)
    for run in runs:
        execute_run(run, with_views, settings_of(single))
    execute_pack(expand(packed), with_views, settings_of(packed))
    by_single, by_pack = rows(single.results_dir), rows(packed.results_dir)
    took_views = set()
    for run in runs:
        config = run.config

        def predictions(features: torch.Tensor) -> list[int]:
            return make_method(config["method"], stream.class_embeddings, stream.class_ids, stream.num_classes,
                               **config["hparams"]).run(features).predictions.tolist()

        wants = config["method"] == "tda" or config["hparams"].get("view_selection") == "adaptive"
        expected = predictions(views if wants else means)
        assert [r["pred"] for r in by_single[run.run_id]] == expected
        assert [r["pred"] for r in by_pack[run.run_id]] == expected
        if wants:
            assert predictions(means) != expected          # the views make a difference here
            took_views.add(config["method"])
    assert took_views == {"tda", "bca"} and len(runs) == 4


def test_a_running_trial_records_how_far_it_got_in_its_runs_rows(tmp_path):
    """The dashboard's running runs read the runs table: the trial writes its stage there as it goes and clears
    it when the run finishes."""
    spec = spec_in(tmp_path, methods=[{"method": "clip"}])
    run = expand(spec)[0]
    seen: list[tuple] = []

    def progress(stage: str, done: int, total: int) -> None:
        seen.append((stage, done, total, read_run(spec.results_dir, spec.name, run.run_id)))

    execute_trial(make_trials([run], 1)[0], settings_of(spec), progress)
    adapting = [(done, row) for stage, done, total, row in seen if stage == "adapting"]
    assert [done for done, _ in adapting] == [100, 200, 300, 400, 450]
    # each call is recorded after it reaches the driver: the row holds the previous stage's report
    assert adapting[1][1]["progress"] == "adapting 100/450 samples" and adapting[1][1]["status"] == "running"
    final = read_run(spec.results_dir, spec.name, run.run_id)
    assert final["status"] == "finished" and final["progress"] is None


def test_stored_prediction_is_the_traces_argmax_on_tied_posteriors():
    """A uniform posterior row (ZLaP's image with no link to any text) or a tie stores the first maximum, as the
    trace's argmax and the official codes take it, with top-5 in the same order (topk's pick among ties is
    unspecified: it stored class 8 of a uniform row)."""
    from orchestrator.methods.base import Trace, empty_trace
    from orchestrator.sweep.pieces import trace_rows

    K = 10
    post = torch.full((3, K), 1.0 / K)
    post[1] = torch.tensor([0.0, 0.3, 0.0, 0.3, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0])
    post[2] = torch.softmax(torch.arange(K, dtype=torch.float32), dim=0)
    _, selected, gated, gated_prior = empty_trace(3, K, torch.device("cpu"))
    trace = Trace(post, selected, gated, gated_prior)
    rows = trace_rows(trace, torch.tensor([0, 3, 9]))
    assert rows["pred"].tolist() == trace.predictions.tolist() == [0, 1, 9]
    assert rows["top5"].tolist() == [[0, 1, 2, 3, 4], [1, 3, 4, 5, 6], [9, 8, 7, 6, 5]]
    assert rows["confidence"].tolist() == pytest.approx([0.1, 0.3, float(post[2, 9])])
