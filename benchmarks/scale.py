"""A study-size results dir: how long opening, querying, reporting and the dashboard take, and what a big grid's
trials cost with and without automatic packing.

    python -m benchmarks.scale [--runs 100000] [--rows-per-run 2000] [--live-runs 2000] [--sweep-runs 3000]
                               [--unpacked-runs 300] [--dir DIR] [--keep] [--ab CHECKOUT [--rounds 2]]

1. Build: `--live-runs` runs go through the sweep's own write path (RunWriter: rows in parts, runs-table rows,
   then `compaction.compact`, as a sweep compacts); the rest are generated a segment at a time and committed with
   `store.add_segment` (the segment writer compaction uses), since writing 10^5 runs' small files first would
   take hours here. Rows are generated (a BCA-like study: per dataset and seed one CLIP run and a tau x n2 grid
   of BCA runs, K = 1000), not copied. Each run also gets `bca verify`-checkable metrics.
2. Reads, each in a fresh process (its time, and its peak resident memory): open (ResultsDB()), a count over
   samples, aggregates over the accuracy, summary (every metric's mean and each configuration's two-level
   interval and p-value) and paired views (every run's interval and p-value), the same statistics against
   another baseline (`gains_against`), the `tuned` view on about half the runs (`READS`); `bca report` end to end
   (its default table, `--metric macro_f1`, `--tune-on` half the runs), the dashboard's first page
   and one run's page (Streamlit AppTest: the page's script run in a fresh process, its imports of the dashboard
   and orchestrator included; streamlit's own import and its scan for custom components not, as a running
   `bca dashboard` has done both when it started).
   With `--ab CHECKOUT` (another checkout of this repository, e.g. main's), `bca report` and the first page are
   then timed with its code and this one's alternately, each in a fresh process on the same dir (wall and CPU
   seconds), and it says whether the two reports printed the same bytes. `--dir` holding a results dir reuses
   it (no build); `--sweep-runs 0` skips the sweeps, `--runs 0` the read steps.
3. Sweeps: a `--sweep-runs` grid of 300-sample synthetic runs with the spec's defaults (`pack: auto`), end to
   end (`bca sweep`, Ray's start included), and `--unpacked-runs` of the same grid with `pack: 1`; per-run
   wall time of each, and Tune's state per run. `--runs 0` runs only this step.

A benchmark, not a test: the numbers depend on the machine and its load (printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
K = 1000
DATASETS = 15
TAUS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
N2S = (2, 5, 10, 20, 50, 100, 200)


def _configs(runs: int) -> list[dict]:
    """Blocks of (dataset, seed): a CLIP run and up to 49 BCA runs over tau x n2, until `runs` configs."""
    out: list[dict] = []
    block = 0
    while len(out) < runs:
        dataset, seed = f"set{block % DATASETS:02d}", block // DATASETS
        base = {"sweep": "scale", "backbone": "ViT-B-16", "pretrained": "openai", "dataset": dataset, "seed": seed,
                "templates": "ensemble7", "num_templates": 7, "views": "single"}
        out.append({**base, "method": "clip", "hparams": {"logit_scale": 100.0}})
        for tau in TAUS:
            for n2 in N2S:
                if len(out) < runs:
                    out.append({**base, "method": "bca", "hparams": {"tau": tau, "n1": 30000, "n2": n2}})
        block += 1
    return out[:runs]


def _rows(run_id: str, n: int, rng: np.random.Generator, accuracy: float) -> dict[str, np.ndarray]:
    labels = rng.integers(0, K, n).astype(np.int32)
    hit = rng.random(n) < accuracy
    preds = np.where(hit, labels, (labels + 1 + rng.integers(0, K - 1, n)) % K).astype(np.int32)
    conf = np.where(hit, rng.uniform(0.4, 1.0, n), rng.uniform(0.05, 0.7, n)).astype(np.float32)
    top5 = np.concatenate([preds[:, None], (preds[:, None] + rng.integers(1, K, (n, 4))) % K], axis=1).astype(np.int32)
    return {"label": labels, "pred": preds, "confidence": conf, "top5": top5,
            "prob_true": np.where(hit, conf, conf * rng.uniform(0, 0.5, n)).astype(np.float32),
            "gated": conf > 0.5}


def _accuracy(config: dict) -> float:
    tau, n2 = config["hparams"].get("tau", 0.0), config["hparams"].get("n2", 0)
    return 0.55 + 0.05 * tau + 0.01 * np.log1p(n2) + 0.02 * (int(config["dataset"][3:]) % 5)


def build(root: Path, runs: int, n: int, live_runs: int) -> dict[str, float]:
    import pyarrow as pa

    from orchestrator.results import compaction, schema, store
    from orchestrator.results.writer import RunWriter, package_versions

    configs = _configs(runs)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for config in configs[:live_runs]:
        writer = RunWriter(root, config)
        cols = _rows(writer.run_id, n, rng, _accuracy(config))
        writer.mark("running", n_samples=n)
        part = 1000
        for start in range(0, n, part):
            sl = slice(start, start + part)
            writer.write_part(start, {"image_id": [f"img_{i:07d}" for i in range(start, min(n, start + part))],
                                      **{k: v[sl] for k, v in cols.items()},
                                      "selected": np.where(cols["gated"][sl], cols["pred"][sl], -1)})
        writer.mark("finished", n_samples=n, accuracy=100.0 * float(np.mean(cols["label"] == cols["pred"])),
                    samples_per_s=20000.0)
    t_live = time.perf_counter() - t0
    t0 = time.perf_counter()
    compaction.compact(root)
    t_compact = time.perf_counter() - t0
    t0 = time.perf_counter()
    image_ids = pa.array([f"img_{i:07d}" for i in range(n)], pa.string())
    per_segment = max(1, compaction.SEGMENT_ROWS // n)
    rest = configs[live_runs:]
    now = pa.scalar(time.time() * 1e6, pa.timestamp("us", tz="UTC")).as_py()
    for first in range(0, len(rest), per_segment):
        chunk = rest[first:first + per_segment]
        run_rows, columns = [], {k: [] for k in ("label", "pred", "confidence", "top5", "prob_true", "gated")}
        for config in chunk:
            writer = RunWriter(root, config)
            cols = _rows(writer.run_id, n, rng, _accuracy(config))
            for k in columns:
                columns[k].append(cols[k])
            row = writer.base_row()
            row.update(status="finished", n_samples=n, samples_per_s=20000.0, started_at=now, finished_at=now,
                       updated_at=now, host="bench", versions=package_versions(),
                       accuracy=100.0 * float(np.mean(cols["label"] == cols["pred"])))
            run_rows.append(row)
        m = len(chunk)
        cat = {k: np.concatenate(v) for k, v in columns.items()}
        per_run = {c.name: [r[c.name] for r in run_rows] for c in schema.SEGMENT_RUN_COLUMNS}
        samples = pa.table({
            "run_id": pa.array(np.repeat([r["run_id"] for r in run_rows], n), pa.string()),
            "sample_idx": np.tile(np.arange(n, dtype=np.int64), m),
            "image_id": pa.chunked_array([image_ids] * m),
            "label": cat["label"], "pred": cat["pred"], "correct": cat["label"] == cat["pred"],
            "confidence": cat["confidence"], "gated": cat["gated"], "gated_prior": cat["gated"],
            "selected": np.where(cat["gated"], cat["pred"], -1).astype(np.int32),
            "top5": pa.FixedSizeListArray.from_arrays(cat["top5"].reshape(-1), 5).cast(pa.list_(pa.int32())),
            "prob_true": cat["prob_true"], "is_ood": np.zeros(m * n, bool),
            "source": pa.array(np.repeat(per_run["dataset"], n), pa.string()),
            **{c.name: pa.array(np.repeat(np.array(per_run[c.name], dtype=object), n), c.arrow)
               for c in schema.SEGMENT_RUN_COLUMNS},
        })
        runs_table = pa.Table.from_pylist(run_rows, schema=schema.run_table_schema({}))
        store.add_segment(root, samples, runs_table)
        print(f"  segment {first // per_segment + 1}/{-(-len(rest) // per_segment)}: {m} runs", flush=True)
    return {"live_s": t_live, "compact_s": t_compact, "segments_s": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------- measured in children
# The read steps' queries, each timed in a fresh process. `summary` reads every metric's mean (the newer
# macro-F1, balanced accuracy and 20-bin ECE among them) and the two-level statistics of each configuration's
# gain; `gains` is the same statistics against another baseline (here CLIP, through its pairing macro);
# `tuned` the honest-tuning view with about half the runs as tuning runs.
TUNE_ON = "run_id < '8'"  # about half the runs, whatever their seeds
READS = {
    "count": "SELECT count(*) AS n FROM samples",
    "accuracy": "SELECT method, count(*) AS runs, avg(accuracy) AS acc, avg(ece) AS ece FROM accuracy GROUP BY 1",
    "summary": "SELECT method, count(*) AS configs, avg(mean) AS acc, avg(gain) AS gain, avg(macro_f1_mean) AS f1, "
               "avg(balanced_accuracy_mean) AS bacc, avg(ece20_mean) AS ece20, avg(paired_gain) AS paired, "
               "avg(gain_ci_low) AS low, avg(gain_ci_high) AS high, avg(gain_p) AS p, min(gain_test) AS test "
               "FROM summary GROUP BY 1 ORDER BY 1",
    "paired": "SELECT count(*) AS runs, avg(gain) AS gain, avg(gain_ci_low) AS low, avg(gain_ci_high) AS high, "
              "avg(p_mcnemar) AS p FROM paired",
    "gains": "SELECT count(*) AS configs, avg(paired_gain) AS gain, avg(gain_ci_low) AS low, "
             "avg(gain_ci_high) AS high, avg(gain_p) AS p FROM gains_against('clip')",
    "tuned": "SELECT method, count(DISTINCT group_id) AS chosen, count(*) AS runs, avg(accuracy) AS acc, "
             "avg(macro_f1) AS f1 FROM tuned((SELECT list(run_id) FROM runs WHERE " + TUNE_ON + ")) GROUP BY 1 "
             "ORDER BY 1",
}


def _measure(kind: str, root: str) -> dict:
    """One step in this process: `seconds` from after the imports (open + query), peak resident memory."""
    from orchestrator.results.db import ResultsDB

    t0 = time.perf_counter()
    out: dict = {}
    if kind == "open":
        db = ResultsDB(root)
        out["seconds"] = time.perf_counter() - t0
        db.close()
    elif kind in READS:
        sql = READS[kind]
        with ResultsDB(root) as db:
            t1 = time.perf_counter()
            out["result"] = str(db.sql(sql).to_pylist())[:200]
            out["query_s"] = time.perf_counter() - t1
        out["seconds"] = time.perf_counter() - t0
    elif kind in ("dashboard", "run_page"):
        os.environ["BCA_RESULTS_DIR"] = root
        from streamlit.testing.v1 import AppTest

        from dashboard import APP_PATH

        at = AppTest.from_file(str(APP_PATH), default_timeout=600)
        if hasattr(at, "_bidi_component_manager"):
            # A running server scans the installed packages for custom components once, when it starts (~1 s
            # here); AppTest does it in its first run: done before the page is timed, as a server has it done.
            from streamlit.components.v2.component_manager import BidiComponentManager

            at._bidi_component_manager = BidiComponentManager()
            at._bidi_component_manager.discover_and_register_components(start_file_watching=False)
        if kind == "run_page":
            with ResultsDB(root) as db:
                run = db.sql("SELECT run_id FROM runs WHERE method = 'bca' LIMIT 1").to_pylist()[0]["run_id"]
            at.query_params["page"] = "Run"
            at.query_params["run"] = run
        t0, c0 = time.perf_counter(), _cpu_s()  # a page's time: the script run (its imports and queries included)
        at.run()
        out["seconds"], out["cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
        out["errors"] = [str(e.value)[:200] for e in at.exception]
    out["peak_mb"] = peak_mb()
    return out


def _cpu_s() -> float:
    """User + system CPU seconds of this process, all its threads (far less load-dependent than wall time)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the parent across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(args: list[str], code: Path = ROOT, output: bool = False) -> dict:
    """Run `python ARGS` in a fresh process with `code` (a checkout) first on the path: its wall seconds, its CPU
    seconds (user + system), what it printed last as JSON, and with `output` all it printed."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *args], cwd=code, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(code)})
    wall, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    if done.returncode != 0:
        return {"seconds": wall, "error": (done.stdout + done.stderr)[-800:]}
    last = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return {**(json.loads(last[-1]) if last else {}), "wall_s": wall, "process_cpu_s": cpu,
            **({"printed": done.stdout} if output else {})}


def _report_child(root: str, code: Path = ROOT, output: bool = False, options: tuple[str, ...] = ()) -> dict:
    """`bca report [OPTIONS]` end to end, its exit code and its own peak memory read back through a wrapper."""
    script = ("import sys, json\n"
              "from benchmarks.scale import peak_mb\n"
              "from orchestrator.cli import app\n"
              "code = 0\n"
              "try:\n    app(['report', '--results', *sys.argv[1:]])\n"
              "except SystemExit as e:\n    code = e.code\n"
              "print(json.dumps({'peak_mb': peak_mb(), 'rc': code}))\n")
    out = _child(["-c", script, root, *options], code, output)
    out["seconds"] = out.get("wall_s")
    return out


def _ab(root: Path, against: Path, rounds: int) -> None:
    """`bca report` and the dashboard's first page with another checkout's code (`against`, e.g. main) and this
    one's, alternately, each in a fresh process on the same results dir: the gain measured in one run. Says
    whether the two reports printed the same bytes."""
    printed: dict[str, set[str]] = {"against": set(), "this": set()}
    for r in range(1, rounds + 1):
        for step in ("report", "dashboard"):
            for name, code in (("against", against), ("this", ROOT)):
                # the page is timed by this file's code whichever code it runs (the other checkout's dashboard
                # first on the path), so both are timed the same way
                out = (_report_child(str(root), code, output=True) if step == "report" else
                       _child([str(Path(__file__).resolve()), "--measure", step, "--dir", str(root)], code))
                if step == "report":
                    printed[name].add(out.pop("printed", "").rsplit("\n{", 1)[0])
                cpu = f", {out['cpu_s']:.2f} s CPU in the page" if "cpu_s" in out else ""
                print(f"round {r} {name} ({code}) {step}: {out.get('seconds') or 0:.2f} s{cpu}; process "
                      f"{out['wall_s']:.2f} s wall, {out['process_cpu_s']:.2f} s CPU; peak {out.get('peak_mb') or 0:.0f} MB"
                      f"{'; ' + out['error'][-300:] if 'error' in out else ''}; load {os.getloadavg()[0]:.1f}",
                      flush=True)
    same = len(printed["against"] | printed["this"]) == 1
    print(f"`bca report` printed {'the same bytes' if same else 'DIFFERENT output'} with both codes", flush=True)


def _sweep(directory: Path, runs: int, pack: str | int) -> dict:
    seeds = max(1, runs // (len(TAUS) * len(N2S) * 2))
    spec = {"name": f"grid{pack}", "results_dir": str(directory / "results"),
            "datasets": [{"synthetic": "label_shift", "n": 300, "num_classes": 100, "dim": 64}],
            "methods": [{"method": "bca", "tau": [round(0.05 * i, 2) for i in range(1, 15)],
                         "n2": [1, 2, 5, 10, 20, 50, 100], "n1": 30000}],
            "seeds": list(range(seeds)), "resources": {"cpus": 1}}
    if pack != "auto":
        spec["pack"] = pack
    path = directory / f"grid{pack}.yaml"
    path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--yes"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    tune = directory / "results" / "tune"
    state = sum(p.stat().st_size for p in tune.rglob("*") if p.is_file()) if tune.is_dir() else 0
    n = seeds * len(TAUS) * 2 * len(N2S)
    # the sweep's own closing count, not whatever a Ray worker printed last
    tail = [line for line in (done.stdout + done.stderr).splitlines() if " runs finished, " in line][-1:]
    return {"runs": n, "seconds": wall, "per_run_ms": 1000 * wall / n, "tune_kb_per_run": state / 1024 / n,
            "rc": done.returncode, "tail": tail}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rows-per-run", type=int, default=2000)
    parser.add_argument("--live-runs", type=int, default=2000, help="runs written through RunWriter + compact")
    parser.add_argument("--sweep-runs", type=int, default=3000, help="0: no sweep measurements")
    parser.add_argument("--unpacked-runs", type=int, default=294)
    parser.add_argument("--dir", type=Path, default=None, help="build here (default a temp dir, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the results dir")
    parser.add_argument("--ab", type=Path, default=None,
                        help="also time `bca report` and the first page with this checkout's code (e.g. main) and "
                             "this one's, alternately, on the same results dir")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --ab")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(_measure(args.measure, str(args.dir))))
        return 0
    work = Path(tempfile.mkdtemp(prefix="bca-scale-")) if args.dir is None else args.dir
    root = work / "results"
    print(f"machine: {os.cpu_count()} cpus; load average at start {os.getloadavg()[0]:.1f} (shared with other "
          f"work: treat seconds as rough)", flush=True)
    try:
        if args.runs:
            _reads(args, root)
        if args.ab is not None:
            _ab(root, args.ab.resolve(), args.rounds)
        if args.sweep_runs:
            sweep_dir = work / "sweeps"
            for label, runs, pack in (("pack: auto (default)", args.sweep_runs, "auto"),
                                      ("pack: 1", args.unpacked_runs, 1)):
                (sweep_dir / str(pack)).mkdir(parents=True, exist_ok=True)
                r = _sweep(sweep_dir / str(pack), runs, pack)
                print(f"sweep {label}: {r['runs']} runs of 300 samples in {r['seconds']:.1f} s end to end = "
                      f"{r['per_run_ms']:.0f} ms per run; Tune state {r['tune_kb_per_run']:.1f} KB per run; "
                      f"rc {r['rc']}; {r['tail'][-1] if r['tail'] else ''}", flush=True)
        print(f"load average at end {os.getloadavg()[0]:.1f}")
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


# `bca report` end to end: the default table, a newer metric's, and tuned on about half the runs.
REPORTS = {"report": (), "report_macro_f1": ("--metric", "macro_f1"), "report_tune_on": ("--tune-on", TUNE_ON)}


def _reads(args: argparse.Namespace, root: Path) -> None:
    """Build the results dir unless it exists, then measure every read step in a fresh process."""
    built = {}
    if not root.exists():
        print(f"building {args.runs:,} runs x {args.rows_per_run:,} rows in {root}", flush=True)
        built = build(root, args.runs, args.rows_per_run, min(args.live_runs, args.runs))
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    files = sum(1 for p in root.rglob("*") if p.is_file())
    print(f"results dir: {files:,} files, {size / 2**20:,.0f} MiB; build: "
          + ", ".join(f"{k} {v:.1f}" for k, v in built.items()), flush=True)
    results = {}
    for kind in ("open", *READS):
        results[kind] = _child(["-m", "benchmarks.scale", "--measure", kind, "--dir", str(root)])
        print(f"  {kind}: {results[kind]}", flush=True)
    for name, options in REPORTS.items():
        results[name] = _report_child(str(root), options=options)
        print(f"  {name}: {results[name]}", flush=True)
    for kind in ("dashboard", "run_page"):
        results[kind] = _child(["-m", "benchmarks.scale", "--measure", kind, "--dir", str(root)])
        print(f"  {kind}: {results[kind]}", flush=True)
    targets = {"open": 2, **{kind: 10 for kind in READS}, **{name: 10 for name in REPORTS}, "dashboard": 5,
               "run_page": None}
    asked = f"asked for {args.runs:,} runs x {args.rows_per_run:,} rows" if built else "the store in --dir, not rebuilt"
    print(f"\n{results['count'].get('result')} rows in the store ({asked})")
    # the process's CPU seconds (its start and imports included) move far less with the machine's load than wall
    print("| step | seconds | process CPU s | peak MB | target |")
    print("|---|---:|---:|---:|---|")
    for kind, target in targets.items():
        r = results[kind]
        secs = r.get("seconds")
        met = "-" if target is None or secs is None else ("met" if secs < target else "NOT met") + f" (< {target} s)"
        if r.get("rc"):
            met = f"exit code {r['rc']}"
        mem = r.get("peak_mb")
        memory = "" if mem is None else f"; < 2 GB {'met' if mem < 2048 else 'NOT met'}"
        cpu = r.get("process_cpu_s")
        print(f"| {kind} | {secs if secs is None else round(secs, 2)} | {cpu if cpu is None else round(cpu, 2)} | "
              f"{mem if mem is None else round(mem)} | {met}{memory} |")


if __name__ == "__main__":
    sys.exit(main())
