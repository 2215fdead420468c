"""One order-free run's stream split into shards (a method entry's `shards: N`), each its own trial, merged into
exactly the rows one trial writes: at the trial level for every episodic method on a multi-view stream where
the views change the predictions, shards run in any order, a shard killed mid-way and resumed; the spec's
checks; and a Ray sweep on a tiny real dataset (the views an episodic method needs come from images), sharded
against unsharded."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from orchestrator import registry
from orchestrator.methods.episodic import order_free
from orchestrator.results.schema import config_hash, normalize_config
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.load import SpecError, load_spec, validate_spec
from orchestrator.sweep.plan import DataSource, Run, Shard, _Group, expand, make_trials
from orchestrator.sweep.shard import execute_shard
from orchestrator.sweep.pieces import Settings, Stream
from orchestrator.sweep.trial import execute_run
from view_streams import view_stream

N, PART = 230, 40
# what differs between two executions of one run (timings, hosts, clocks), left out of the comparisons
VOLATILE = {"samples_per_s", "latency_ms", "method_mem_mb", "time_encoder_s", "time_logits_s", "time_posterior_s",
            "time_update_s", "peak_mem_mb", "warmup_s", "host", "versions", "started_at", "finished_at",
            "updated_at", "progress"}
# the episodic methods that run on features alone (a prompt-tuning method's card names the text tower it needs,
# which this stream has not)
EPISODIC = sorted(name for name in registry.method_names()
                  if order_free(name) and getattr(registry.method_card(name), "text_encoder", None) is None)


@pytest.fixture(scope="module")
def stream() -> Stream:
    """A synthetic stream with 8 views per sample, the augmented ones (nearly) other samples of the class
    (informative, as crops are), so that every episodic method's view handling changes predictions."""
    views, class_embeddings, class_ids, num_classes, labels = view_stream(
        "iid", num_classes=6, dim=24, n=N, views=8, class_views=True, seed=4)
    # a little noise keeps two picks of one sample apart (MTA refuses coinciding views: a zero bandwidth)
    noise = torch.randn(views[:, 1:].shape, generator=torch.Generator().manual_seed(5)) * 0.01
    views[:, 1:] = torch.nn.functional.normalize(views[:, 1:] + noise, dim=-1)
    return Stream(features=views[:, 0], view_features=views, labels=labels, image_ids=[f"img{i}" for i in range(N)],
                  order=torch.arange(N), source_index=torch.zeros(N, dtype=torch.int64),
                  is_ood=torch.zeros(N, dtype=torch.bool), sources=["views"] * N, class_embeddings=class_embeddings,
                  class_ids=class_ids, num_classes=num_classes, class_names=[f"class{c}" for c in range(num_classes)],
                  encode_s=0.0, skipped=[])


def make_run(method: str, shards: int = 1) -> Run:
    hparams = registry.method_card(method).resolve({})
    config = normalize_config({"sweep": "shards", "backbone": "synthetic", "dataset": "views", "method": method,
                               "seed": 1, "views": "crops", "hparams": hparams})
    base = {k: v for k, v in config.items() if k != "hparams"}
    names = tuple(sorted(hparams))
    return Run(config_hash(config), DataSource("views", 1), _Group(base, names, shards),
               tuple(hparams[k] for k in names))


def settings(directory: Path, failpoint: str | None = None) -> Settings:
    return Settings(results_dir=str(directory), cache_dir=None, data_root=None, part_rows=PART, failpoint=failpoint)


def outcome(directory: Path, run: Run) -> tuple[list[dict], dict, list[str]]:
    """(its rows in stream order, its runs-table row without timings, its part files)."""
    writer = RunWriter(directory, run.config)
    parts = sorted(p.name for p in writer.samples_dir.glob("part-*.parquet"))
    rows = [row for name in parts for row in pq.read_table(writer.samples_dir / name).to_pylist()]
    record = {k: v for k, v in read_run(directory, "shards", run.run_id).items() if k not in VOLATILE}
    return rows, record, parts


@pytest.mark.parametrize("method", EPISODIC)
def test_shards_in_any_order_write_the_unsharded_runs_rows(method, stream, tmp_path):
    assert {"zero", "mta", "tps"} <= set(EPISODIC)
    run = make_run(method)
    whole = execute_run(run, stream, settings(tmp_path / "whole"))
    views_acted = (torch.tensor([r["pred"] for r in outcome(tmp_path / "whole", run)[0]])
                   != (stream.features @ stream.class_embeddings.T).argmax(1)).any()
    assert views_acted, f"{method}: the views never changed a prediction; the comparison would prove little"
    sharded = settings(tmp_path / "sharded")
    results = [execute_shard(run, Shard(k, 3), stream, sharded) for k in (2, 0, 1)]
    assert [r["finished"] for r in results] == [False, False, True]
    assert sum(r["rows_written"] for r in results) == N
    assert outcome(tmp_path / "sharded", run) == outcome(tmp_path / "whole", run)
    assert results[-1]["accuracy"] == whole["accuracy"] and results[-1]["ece"] == whole["ece"]
    assert verify_results(tmp_path / "sharded").ok


def test_a_shard_killed_mid_way_resumes_from_its_last_complete_part(stream, tmp_path):
    run = make_run("zero")
    execute_run(run, stream, settings(tmp_path / "whole"))
    directory = tmp_path / "sharded"
    shard = Shard(0, 2)
    assert shard.rows(N, PART) == (0, 120) and Shard(1, 2).rows(N, PART) == (120, N)  # 6 parts, 3 each
    with pytest.raises(RuntimeError, match="failpoint"):
        execute_shard(run, shard, stream, settings(directory, failpoint=f"raise:1:{tmp_path / 'flag'}"))
    writer = RunWriter(directory, run.config)
    assert writer.missing(0, N) == [(PART, N)]
    assert read_run(directory, "shards", run.run_id)["status"] == "failed"
    other = execute_shard(run, Shard(1, 2), stream, settings(directory))
    assert not other["finished"] and writer.missing(0, N) == [(PART, 120)]
    resumed = execute_shard(run, shard, stream, settings(directory))
    assert resumed["resumed_from"] == PART and resumed["rows_written"] == 120 - PART and resumed["finished"]
    assert outcome(directory, run) == outcome(tmp_path / "whole", run)
    assert verify_results(directory).ok


def test_more_shards_than_parts_leave_some_empty_and_still_finish(stream, tmp_path):
    run = make_run("mta")
    execute_run(run, stream, settings(tmp_path / "whole"))
    count = 8  # 6 parts of 40 rows
    assert sum(hi - lo for lo, hi in (Shard(k, count).rows(N, PART) for k in range(count))) == N
    results = [execute_shard(run, Shard(k, count), stream, settings(tmp_path / "sharded")) for k in range(count)]
    assert [r["finished"] for r in results] == [False] * (count - 1) + [True]
    assert outcome(tmp_path / "sharded", run) == outcome(tmp_path / "whole", run)


# ------------------------------------------------------------------------------------------ spec and plan
SYNTHETIC = {"name": "s", "results_dir": "results", "seeds": [1],
             "datasets": [{"synthetic": "label_shift", "n": 100}]}


@pytest.mark.parametrize("method", ["bca", "tda"])
def test_shards_are_refused_for_a_method_whose_state_carries_between_samples(method, tmp_path):
    with pytest.raises(SpecError) as err:
        validate_spec({**SYNTHETIC, "methods": [{"method": "clip"}, {"method": method, "shards": 2}]},
                      base_dir=tmp_path)
    assert (f"methods[1].shards: '{method}' carries its state from sample to sample, so its stream cannot be split "
            f"into shards run apart") in str(err.value)
    assert "zero" in str(err.value) and "mta" in str(err.value)
    validate_spec({**SYNTHETIC, "methods": [{"method": method, "shards": 1}]}, base_dir=tmp_path)  # not split


def test_a_sharded_run_keeps_its_run_id_and_becomes_one_trial_per_shard(tmp_path):
    real = real_spec(tmp_path, "plan")
    plain = validate_spec(real, base_dir=tmp_path)
    sharded = validate_spec({**real, "methods": [{"method": "zero", "shards": 3}, {"method": "mta"}]},
                            base_dir=tmp_path)
    assert [r.run_id for r in expand(sharded)] == [r.run_id for r in expand(plain)]
    trials = make_trials(expand(sharded), "auto")
    zero = next(r for r in expand(sharded) if r.method == "zero")
    shards = [t for t in trials if t.shard is not None]
    assert [(t.key, t.shard, t.runs) for t in shards] == [
        (f"{zero.run_id}-shard{k + 1}of3", Shard(k, 3), (zero,)) for k in range(3)]
    assert [t.runs[0].method for t in trials if t.shard is None] == ["mta"]


# ------------------------------------------------------------------------------------------ through Ray
def real_spec(directory: Path, name: str) -> dict:
    """Zero and MTA on a tiny real dataset (their official crops, encoded by the tiny open_clip model)."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    if not (directory / "data").is_dir():
        build_dataset("imagenet-a", directory / "data", num_classes=3, per_class=4)
    config = write_model_config(TINY_VIT, directory / "models")
    return {"name": name, "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
            "datasets": ["imagenet-a"], "views": "crops", "methods": [{"method": "zero"}, {"method": "mta"}],
            "seeds": [1], "resources": {"cpus": 1}, "part_rows": 3, "pack": 1}


def sweep_outcome(spec) -> dict[str, tuple[list[dict], dict]]:
    """run_id -> (its rows in stream order, its runs-table row without timings)."""
    out = {}
    for run in expand(spec):
        writer = RunWriter(spec.results_dir, run.config)
        rows = [row for path in sorted(writer.samples_dir.glob("part-*.parquet")) for row in pq.read_table(path).to_pylist()]
        record = read_run(spec.results_dir, spec.name, run.run_id)
        out[run.run_id] = (rows, {k: v for k, v in record.items() if k not in VOLATILE})
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_ray_sweep_of_sharded_runs_writes_the_unsharded_rows_through_a_killed_shard(local_ray, tmp_path,
                                                                                      monkeypatch):
    """Zero in 2 shards and MTA in 3 on a local Ray, one shard's worker SIGKILLed after its first part (Tune retries
    it, and it resumes there): the runs, rows and runs-table rows of the same spec run unsharded, trial by trial."""
    from orchestrator.sweep.runner import run_sweep
    from orchestrator.sweep.pieces import FAILPOINT_ENV, settings_of
    from orchestrator.sweep.trial import execute_trial

    spec = real_spec(tmp_path, "shardsweep")
    whole = validate_spec({**spec, "results_dir": "whole"}, base_dir=tmp_path)
    for trial in make_trials(expand(whole), 1):
        execute_trial(trial, settings_of(whole))
    path = tmp_path / "sharded.yaml"
    path.write_text(yaml.safe_dump({**spec, "results_dir": "sharded", "max_failures": 1,
                                    "methods": [{"method": "zero", "shards": 2}, {"method": "mta", "shards": 3}]}))
    sharded = load_spec(path)
    assert len(make_trials(expand(sharded), "auto")) == 5
    flag = tmp_path / "killed"
    monkeypatch.setenv(FAILPOINT_ENV, f"sigkill:1:{flag}")
    lines: list[str] = []
    outcome = run_sweep(sharded, out=lines.append)  # the driver reads the failpoint; the trials carry it
    assert flag.exists(), "the failpoint never fired"
    assert outcome.ok, (outcome.failed, lines)
    assert any(ln.startswith("retry:") for ln in lines), lines
    assert any("resumed at row" in ln for ln in lines), lines
    assert "2/2 runs finished, 0 failed" in "\n".join(lines) and any("(shard 2/3)" in ln for ln in lines)
    counts = [ln.split("]")[0] + "]" for ln in lines if ln.startswith("[")]
    assert len(counts) == 5 and counts[-1] == "[2/2]" and set(counts) <= {"[0/2]", "[1/2]", "[2/2]"}  # runs, not trials
    assert sweep_outcome(sharded) == sweep_outcome(whole)
    report = verify_results(sharded.results_dir)
    assert report.ok, report.problems


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_docs_sharded_spec_runs_with_the_docs_commands(tmp_path):
    """docs/sweeps.md's sharded spec, its backbone and dataset swapped for the tiny model and a tiny ImageNet-A
    (and no GPU, parts of 3 rows so that every shard has some), through the page's commands verbatim."""
    import re
    import subprocess

    from dashboard_results import bca_executable

    page = (Path(__file__).resolve().parents[1] / "docs" / "sweeps.md").read_text()
    section = page.split("## One run across several GPUs", 1)[1].split("\n## ", 1)[0]
    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    commands = [line.split("#")[0].strip() for line in re.search(r"```bash\n(.*?)```", section, re.S).group(1)
                .splitlines() if line.strip()]
    assert commands == ["bca sweep experiments/sharded.yaml --dry-run", "bca sweep experiments/sharded.yaml"]
    tiny = real_spec(tmp_path, spec["name"])
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "sharded.yaml").write_text(yaml.safe_dump({
        **spec, "backbones": tiny["backbones"], "resources": {"cpus": 1}, "part_rows": 3}))
    shards = {entry["method"]: entry["shards"] for entry in spec["methods"]}
    done = []
    for command in commands:
        done.append(subprocess.run([bca_executable(), *command.split()[1:]], cwd=tmp_path, capture_output=True,
                                   text=True, timeout=600))
        assert done[-1].returncode == 0, done[-1].stdout + done[-1].stderr
    for method, count in shards.items():
        assert f"{method}: 1 run(s) split into {count} shards each ({count} trials" in done[0].stdout
    assert f"{len(shards)}/{len(shards)} runs finished, 0 failed" in done[1].stdout
    assert verify_results(tmp_path / "results").ok


def test_shards_for_an_order_dependent_method_exit_2_naming_the_entry(tmp_path):
    import subprocess

    from dashboard_results import bca_executable

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SYNTHETIC, "methods": [{"method": "tda", "shards": 4}]}))
    done = subprocess.run([bca_executable(), "sweep", str(path), "--dry-run"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "methods[0].shards: 'tda' carries its state from sample to sample" in done.stderr
    assert not (tmp_path / "results").exists()
