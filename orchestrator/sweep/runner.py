"""Execute a sweep with Ray Tune: one trial per run (or per pack of runs), resumable from the results dir.

The results dir, not Tune's experiment state, is the source of truth for resume: every invocation expands the
spec, skips runs whose runs-table status is 'finished', and launches a fresh Tuner over the rest. With or
without `--resume` a re-run does exactly that; `--resume` states the intent (and starts a sweep that was never
started, so scripts can always pass it). Unfinished
runs continue from their last complete part (see trial.py). So `bca sweep SPEC` after a crash, a Ctrl-C, a
killed driver or a lost node picks up exactly where the complete parts end, on this machine or another one.
A 'finished' run whose rows went missing since (what `bca verify` reports) is not complete and runs again from
its last complete part; a finished run made on another version of its dataset's image list is named, and run
again from the start with `rerun_changed`.

One driver per sweep: a lock under <results>/sweeps/ (`sweep_lock`); a second `bca sweep` of the same sweep is
refused naming the holder, before it writes anything. Sweeps of more than LARGE_SWEEP runs to run need `yes`.

Ray: local by default (num_cpus = this machine's cores, no dashboard unless asked for), a Ray of its own even
where a `ray start` cluster runs on this machine (a line names that cluster's address); `address` or
RAY_ADDRESS joins a running cluster, whose nodes must all see the results and cache dirs at the same absolute
path (checked at start). An already initialised Ray session is used as is (the tests share one). Tune's own
console reporter is off; `ProgressCallback` prints one line per finished trial, and now and then one per long
trial still running, instead. Per-sample rows never travel through Ray: the trial writes them itself; only
summary metrics and progress go through `ray.tune.report`, the final metrics with the id of the node that ran
the trial (in Tune's result.json under <results>/tune, beside Tune's own node_ip).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.results import schema
from orchestrator.results.atomic import atomic_write, ensure_dir
from orchestrator.results.writer import RunWriter
from orchestrator.stages import ENCODER_STAGE, STAGE_COLUMNS, stage_column
from orchestrator.sweep.compaction import Compactor
from orchestrator.sweep.compaction import tune_callback as compaction_callback
from orchestrator.sweep.cost import sweep_cost, sweep_memory, trial_device_bytes, unknown_device_note
from orchestrator.sweep.dryrun import weights_issues
from orchestrator.sweep.load import SpecError
from orchestrator.sweep.plan import Run, Trial, expand, make_trials, template_notes
from orchestrator.sweep.progress import ProgressCallback, TrialProgress, dashboard_hint, summary_table
from orchestrator.sweep.record import check_sweep_record, sweep_record_path, write_sweep_record
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.status import INCOMPLETE, changed_data, recorded_rows, run_status
from orchestrator.sweep.pieces import Settings, settings_of
from orchestrator.sweep.trial import deterministic_failure, execute_trial

TUNE_DIR = "tune"  # Tune's storage_path under the results dir (experiment state, per-trial error files)
LARGE_SWEEP = 5000  # runs to run above which a sweep starts only with `yes` (after a look at --dry-run)


@dataclass
class SweepOutcome:
    total: int                                  # runs in the spec
    skipped: int                                # finished before this invocation
    finished: int                               # finished now (including skipped)
    failed: dict[str, str] = field(default_factory=dict)    # run_id -> error
    interrupted: list[str] = field(default_factory=list)   # run_ids stopped by Ctrl-C (recorded as failed)
    not_started: list[str] = field(default_factory=list)   # run_ids Tune never started (Ctrl-C before them)
    table: str = ""

    @property
    def ok(self) -> bool:
        return self.finished == self.total


def _trial_metrics(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Summary metrics a trial reports to Tune: the run's own, or the pack's means."""
    if not results:
        return {"n_runs": 0}
    if "shard" in results[0]:  # one shard: its own rows and rate, and the run's metrics once it finished the run
        return {**results[0], "n_runs": 1}
    keys = ("accuracy", "last50_accuracy", "samples_per_s", *STAGE_COLUMNS, "peak_mem_mb")
    out: dict[str, Any] = {k: sum(r[k] for r in results) / len(results) for k in keys}
    encoder = stage_column(ENCODER_STAGE)
    out[encoder] = sum(r[encoder] for r in results)  # a pack encodes once
    out["peak_mem_mb"] = max(r["peak_mem_mb"] for r in results)
    out.update(n_runs=len(results), n_samples=results[0]["n_samples"],
               rows_written=sum(r["rows_written"] for r in results),
               resumed_from=max(r["resumed_from"] for r in results))
    if len(results) == 1:
        out["run_id"] = results[0]["run_id"]
    return out


def _trainable(config: dict[str, Any], plan: dict[str, Any]) -> None:
    """The Tune function trainable: one trial of the plan, progress and metrics through tune.report only."""
    import ray
    from ray import tune

    trial, settings = plan["trials"][config["trial"]], plan["settings"]
    node = {"node_id": ray.get_runtime_context().get_node_id()}
    try:
        results = execute_trial(trial, settings, TrialProgress(tune.report, settings.progress_every_s))
    except Exception as exc:
        error = deterministic_failure(trial, settings, exc)
        if error is None:
            raise  # Tune retries it (a killed worker, a full disk, ...)
        tune.report({"n_runs": 0, "error": error, **node})  # ProgressCallback counts it failed; no retry
        return
    tune.report({**_trial_metrics(results), **node})


class SweepLocked(RuntimeError):
    """Another driver runs this sweep (the message names its pid, host and start time)."""


class NeedsConfirmation(RuntimeError):
    """A sweep of more than LARGE_SWEEP runs to run, started without `yes`."""


@contextlib.contextmanager
def sweep_lock(spec: SweepSpec):
    """Hold <results>/sweeps/<name>.lock while this driver runs the sweep; its holder is described in
    <name>.owner.json. A second driver gets SweepLocked at once and writes nothing."""
    from filelock import FileLock, Timeout

    folder = schema.sweeps_root(spec.results_dir)
    lock_path, owner_path = folder / f"{spec.name}.lock", folder / f"{spec.name}.owner.json"
    if not folder.is_dir():
        ensure_dir(folder, "sweep record")
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            owner = json.loads(owner_path.read_text())
            who = f"pid {owner['pid']} on {owner['host']}, since {owner['since']}"
        except (OSError, ValueError, KeyError):
            who = "another process (its owner file is not readable)"
        raise SweepLocked(f"sweep {spec.name!r} in {spec.results_dir} is being run by {who}; expected one "
                          f"`bca sweep` per sweep: wait for it, or stop it and resume") from None
    try:
        since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        body = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
        atomic_write(owner_path, lambda tmp: Path(tmp).write_text(body), "sweep lock owner")
        yield
    finally:
        owner_path.unlink(missing_ok=True)
        lock.release()


class NoGPU(ValueError):
    """The spec asks for resources no node of the Ray cluster has (GPU shares without a GPU, more CPUs than a
    node): trials would wait forever."""


class SharedStorageError(ValueError):
    """Joining a cluster with a results or cache dir its other nodes could not use."""


class ClusterUnreachable(ValueError):
    """--address / RAY_ADDRESS names a head that does not answer (Ray itself would retry forever)."""


JOIN_WAIT_S = 20.0  # how long a head that does not accept connections is retried before the sweep gives up
_ADDRESS = re.compile(r"^(ray://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")
_EXPECTED_ADDRESS = ("expected the address `ray start --head` printed, host:port (port 6379 by default), or no "
                     "--address (and no RAY_ADDRESS) to run on a local Ray")


def check_address(address: str) -> None:
    """The form of --address / RAY_ADDRESS, checked before anything else (a finished sweep too): host:port,
    ray://host:port or 'auto' (Ray finds a head on this machine), else ClusterUnreachable naming it."""
    if address == "auto":
        return
    if address.startswith(("http://", "https://")):
        raise ClusterUnreachable(f"--address {address}: that is a dashboard's address (`ray job submit` takes it); "
                                 f"a sweep joins the cluster itself: {_EXPECTED_ADDRESS}")
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match[3]) < 65536:
        raise ClusterUnreachable(f"--address {address}: not a Ray address; {_EXPECTED_ADDRESS}")


def check_reachable(address: str, wait_s: float = JOIN_WAIT_S) -> None:
    """The head's port accepts a TCP connection within `wait_s`, else ClusterUnreachable naming the address
    (whose form `check_address` checked). 'auto' (Ray finds a local head itself) is left to Ray."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    deadline, error = time.monotonic() + wait_s, None
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, wait_s)):
                return
        except OSError as exc:
            error = exc.strerror or str(exc)
        if time.monotonic() >= deadline:
            raise ClusterUnreachable(
                f"--address {address}: no Ray head answers there ({error}, retried for {wait_s:g} s); expected the "
                f"address `ray start --head` printed (host:6379), with the head running and its port reachable "
                f"from this machine, or no --address (and no RAY_ADDRESS) to run on a local Ray")
        time.sleep(1.0)


def check_shared_storage(spec: SweepSpec, address: str) -> None:
    """Every node of a cluster writes rows, Tune state and cache entries under these dirs, at the path the
    driver resolved: it must be absolute and writable (and, which no check here can see, the same storage on
    every node). Checked before anything is written, so a wrong path fails at once, not in every trial."""
    for field_name, path in (("results_dir", spec.results_dir), ("cache_dir", spec.cache_dir)):
        if path is None:
            continue
        expected = (f"joining the cluster at {address} needs an absolute path on storage that every node mounts "
                    f"at that same path (EFS, NFS), writable by this user")
        if not Path(path).is_absolute():
            raise SharedStorageError(f"{field_name}: {path} is not absolute; {expected}")
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".bca-write-check-"):
                pass
        except OSError as exc:
            raise SharedStorageError(f"{field_name}: {path} cannot be written ({exc.strerror or exc}); "
                                     f"{expected}") from exc


def _init_ray(address: str | None, gpu: float, dashboard: bool, out: Callable[[str], None]) -> None:
    import ray

    if ray.is_initialized():
        return
    token = "it asks for the token that `ray get-auth-token` prints"
    if address:
        try:
            context = ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as exc:  # ConnectionError is an OSError: not a disk's
            raise ClusterUnreachable(f"--address {address}: Ray could not join the cluster there ({exc}); "
                                     f"{_EXPECTED_ADDRESS}") from None
        if dashboard:
            out(f"Ray dashboard: http://{context.dashboard_url} on the head (from your machine: "
                f"`ray dashboard cluster.yaml`, then http://127.0.0.1:8265; {token})")
        return  # a cluster's autoscaler may still add GPU nodes: no check
    # A new local Ray runs with token authentication unless RAY_AUTH_MODE says otherwise (Ray's own default, which
    # makes ~/.ray/auth_token if there is none; setting the variable here, after Ray read its config, would not
    # reach this process), so no other user of this machine can run code in it through its ports.
    running = _cluster_on_this_machine()
    if running:
        out(f"note: a Ray cluster started with `ray start` runs on this machine at {running}; this sweep runs on a "
            f"local Ray of its own, as every sweep without --address does (to run it on that cluster: --address "
            f"{running})")
    # "local": a new Ray of this sweep's own (without it, ray.init joins the cluster `ray start` left its address for)
    context = ray.init(address="local", num_cpus=os.cpu_count(), logging_level=logging.WARNING,
                       include_dashboard=dashboard, dashboard_host="127.0.0.1")
    if dashboard:
        out(f"Ray dashboard: http://{context.dashboard_url} (this machine only; it closes with the sweep; {token})")
    if gpu > 0 and ray.cluster_resources().get("GPU", 0) < gpu:
        ray.shutdown()
        raise NoGPU(f"resources.gpu: each trial asks for {gpu} GPU but this machine has none; expected "
                    f"resources.gpu: 0 to run on the CPU, or --address of a cluster with GPUs")


def _cluster_on_this_machine() -> str | None:
    """The address of the cluster `ray start` last started on this machine (Ray's own record, which a bare
    ray.init would join), if its port still accepts a connection."""
    from ray._private.services import find_bootstrap_address

    address = find_bootstrap_address(None)
    host, _, port = (address or "").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return address
    except (OSError, ValueError):
        return None


def cpus_issue(cpus: float, nodes: list[dict[str, Any]]) -> str | None:
    """resources.cpus more than any live node has: no trial could ever be placed (Tune would wait forever)."""
    largest = max((n.get("Resources", {}).get("CPU", 0) for n in nodes if n.get("Alive", True)), default=0)
    if cpus > largest:
        return (f"resources.cpus: each trial asks for {cpus:g} CPUs but the largest node of the Ray cluster has "
                f"{largest:g}; expected resources.cpus <= {largest:g}")
    return None


def _check_cpus(cpus: float) -> None:
    import ray

    problem = cpus_issue(cpus, ray.nodes())
    if problem:
        raise NoGPU(problem)


def _mark(writer: RunWriter, error: str, out: Callable[[str], None]) -> None:
    """Record a run as failed. A results dir that cannot take the record (disk full, read-only) must not end the
    sweep from inside Tune's callback: the run stays unfinished, which verify and --resume both see."""
    try:
        writer.mark("failed", error=error)
    except OSError as exc:
        out(f"warning: cannot record run {writer.run_id} as failed: {exc}")


# A trial's error when the sweep was stopped under it (Ctrl-C, `ray job stop`), not a failure of the run.
_STOPPED_ERROR = re.compile(r"^(SystemExit|KeyboardInterrupt)\b")
_INTERRUPTED = "interrupted after "


def _was_stopped(row: dict[str, Any]) -> bool:
    return row.get("status") == "failed" and str(row.get("error") or "").startswith(_INTERRUPTED)


def _mark_stopped(writer: RunWriter, command: str, out: Callable[[str], None]) -> None:
    """Record a run the sweep was stopped under: how far it got (its complete rows) and how to go on."""
    rows = writer.rows_done()
    n = (writer.read_row() or {}).get("n_samples")
    got = f"all {rows} rows (not yet recorded finished)" if n and rows >= n else \
        f"{rows} complete rows{f' (of {n})' if n else ''}"
    try:
        writer.mark("failed", error=f"{_INTERRUPTED}{got}; resume with {command} --resume",
                    progress=f"stopped at {rows}{f'/{n}' if n else ''} rows")
    except OSError as exc:
        out(f"warning: cannot record run {writer.run_id} as interrupted: {exc}")


def _mark_failed(settings: Settings, command: str, out: Callable[[str], None]) -> Callable[[Trial, str], None]:
    """Record a trial's final error on each of its runs that did not finish (a killed worker cannot); a trial
    ended by the sweep's own stop is recorded as interrupted, with how far each run got."""
    def mark(trial: Trial, error: str) -> None:
        for run in trial.runs:
            writer = RunWriter(settings.results_dir, run.config)
            if writer.status() != "finished":
                if _STOPPED_ERROR.match(error):
                    _mark_stopped(writer, command, out)
                else:
                    _mark(writer, error, out)
    return mark


@contextlib.contextmanager
def _stop_on_sigterm(record: Callable[[], Any]):
    """SIGTERM (`ray job stop`, a scheduler's stop) records the running runs as interrupted at once (a SIGKILL
    may follow within seconds), then stops the sweep as Ctrl-C does (SIGINT: Tune's own orderly stop, which keeps
    its experiment state)."""
    def stop(signum: int, frame: Any) -> None:
        record()
        os.kill(os.getpid(), signal.SIGINT)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_sweep(spec: SweepSpec, *, resume: bool = False, address: str | None = None,
              out: Callable[[str], None] = print, command: str = "bca sweep SPEC", ray_dashboard: bool = False,
              progress_every_s: float = 30.0, yes: bool = False, rerun_changed: bool = False,
              runs: list[Run] | None = None) -> SweepOutcome:
    """Run every unfinished run of the spec on Ray Tune; returns what finished, failed or was interrupted.
    `command` is how the user started it, for the resume hints; `ray_dashboard` starts Ray's dashboard with a
    local Ray (on loopback) and prints its address; `progress_every_s`: how often a running trial reports;
    `yes` confirms a sweep of more than LARGE_SWEEP runs; `rerun_changed` runs again the finished runs made on
    another version of their dataset; `runs`: the spec's expansion when the caller already has it."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_address(address)
        check_reachable(address)
        check_shared_storage(spec, address)
    runs = expand(spec) if runs is None else runs
    problem = check_sweep_record(spec, runs)
    if problem:
        raise SpecError(f"sweep {spec.name}", [("name", problem)])
    missing = [] if address else weights_issues(spec)  # on a cluster, the workers hold the weights
    if missing:
        raise SpecError(f"sweep {spec.name}", missing)
    status = run_status(spec, runs)  # read-only: a refusal below leaves the results dir as it was
    changed = changed_data(spec, runs, status) if spec.has_real_datasets else {}
    todo = [r for r in runs if status[r.run_id] != "finished"]
    if rerun_changed:
        todo += [r for stale in changed.values() for r in stale]
    if len(todo) > LARGE_SWEEP and not yes:
        raise NeedsConfirmation(f"sweep {spec.name!r} has {len(todo):,} runs to run (more than {LARGE_SWEEP:,}); "
                                f"check the plan with {command} --dry-run, then start it with --yes")
    with sweep_lock(spec):
        for dataset, stale in changed.items():
            what = "running them again" if rerun_changed else f"run them again with {command} --rerun-changed"
            out(f"warning: {len(stale)} finished run(s) of {dataset} were made on another version of its image list "
                f"(images added, removed or relabelled since): {', '.join(r.run_id for r in stale[:5])}"
                f"{f' and {len(stale) - 5} more' if len(stale) > 5 else ''}; {what}")
        if resume and not sweep_record_path(spec.results_dir, spec.name).exists():
            # Accepted so that scripts can always pass --resume (scripts/demo.sh does).
            out(f"nothing to resume: sweep {spec.name!r} has not been started in {spec.results_dir}; starting it")
        rerun = {r.run_id for stale in changed.values() for r in stale} if rerun_changed else set()
        write_sweep_record(spec, runs, [r.run_id for r in runs
                                        if status[r.run_id] == "finished" and r.run_id not in rerun])
        for stale in changed.values() if rerun_changed else ():
            for run in stale:
                RunWriter(spec.results_dir, run.config).discard_rows()
        incomplete = sum(1 for r in runs if status[r.run_id] == INCOMPLETE)
        skipped = len(runs) - len(todo)
        device_bytes = trial_device_bytes(spec)
        for note in [*template_notes(spec), *unknown_device_note(spec, device_bytes)]:
            out(f"note: {note}")
        out(f"sweep {spec.name}: {len(runs)} runs, {skipped} already finished, {len(todo)} to run "
            f"-> {spec.results_dir}")
        if incomplete:
            out(f"{incomplete} run(s) marked finished have rows missing (see bca verify): running what is missing")
        interrupted: list[str] = []
        not_started: list[str] = []
        errors: dict[str, str] = {}
        if todo:
            trials = make_trials(todo, spec.pack, sweep_cost(spec, recorded_rows(spec, runs)),
                                 sweep_memory(spec, device_bytes))
            errors = _tune(spec, runs, trials,
                           skipped, address, out, command=command,
                           dashboard=ray_dashboard, settings=settings_of(spec, progress_every_s),
                           on_stop=lambda: _record_interrupted(spec, todo, command, out))
            # The runs' rows read once in bulk (one read per segment, one per live file): a per-run read after
            # the compaction at the end would read a segment per run.
            rows = recorded_rows(spec, todo)
            for run in todo:  # a shard failed for good, and a sibling shard started after it marked the run running
                if run.run_id in errors and rows.get(run.run_id, {}).get("status") == "running":
                    _mark(RunWriter(spec.results_dir, run.config), errors[run.run_id], out)
                elif run.run_id in errors and _was_stopped(rows.get(run.run_id, {})):
                    # the failure callback counted its rows while the trial was still stopping: again, now
                    _mark_stopped(RunWriter(spec.results_dir, run.config), command, out)
            interrupted = _record_interrupted(spec, [r for r in todo if r.run_id not in errors], command, out, rows)
            not_started = [r.run_id for r in todo if r.run_id not in errors and r.run_id not in interrupted
                           and r.run_id not in rows]
        return _outcome(spec, runs, skipped, interrupted, not_started, errors, out, command)


def _record_interrupted(spec: SweepSpec, todo: list[Run], command: str, out: Callable[[str], None],
                        rows: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Runs still 'running' once Tune returned were stopped by Ctrl-C (a failed trial is marked by the
    callback), and so were runs whose trial recorded the stop itself as its failure (SystemExit, after the
    callback's record, when Ctrl-C reached the workers too): record them as failed, with how far they got, so
    the runs table tells the truth. `rows`: the runs' runs-table rows (`recorded_rows`) when the caller has
    them."""
    rows = recorded_rows(spec, todo) if rows is None else rows
    stopped = []
    for run in todo:
        row = rows.get(run.run_id, {})
        # one recorded interrupted already (on SIGTERM) was counted while its trial was still stopping, which can
        # write a part after: counted again, so the record says what is on disk
        if row.get("status") == "running" or _was_stopped(row) or (
                row.get("status") == "failed" and _STOPPED_ERROR.match(str(row.get("error") or ""))):
            _mark_stopped(RunWriter(spec.results_dir, run.config), command, out)
            stopped.append(run.run_id)
    return stopped


def _tune(spec: SweepSpec, runs: list[Run], trials: list[Trial], skipped: int, address: str | None,
          out: Callable[[str], None], *, command: str, dashboard: bool, settings: Settings,
          on_stop: Callable[[], Any]) -> dict[str, str]:
    """Run the trials on Tune; returns run_id -> error for the runs of trials that failed for good. SIGTERM
    during the run calls `on_stop`, then ends it like Ctrl-C."""
    # The legacy console output honours verbose=0; Tune's trial tracebacks are summarised by ProgressCallback.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    from ray import tune

    _init_ray(address, spec.resources.gpu, dashboard, out)
    _check_cpus(spec.resources.cpus)
    callback = ProgressCallback(trials, runs, already_done=skipped, out=out, on_failed=_mark_failed(settings, command, out))
    compactor = Compactor(spec.results_dir, out)
    trainable = tune.with_resources(
        tune.with_parameters(_trainable, plan={"trials": {t.key: t for t in trials}, "settings": settings}),
        {"cpu": spec.resources.cpus, "gpu": spec.resources.gpu})
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search([t.key for t in trials])},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"{spec.name}_{stamp}", storage_path=str(Path(spec.results_dir) / TUNE_DIR), verbose=0,
            callbacks=[callback, compaction_callback(compactor)], failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            log_to_file=True),
    )
    # Tune logs each trial error with a traceback, after Ctrl-C one warning per trial without results, and a
    # traceback for each failed save of its experiment state (a full disk); the callback, the final summary and
    # the warning below say the same in one line each.
    # Tune's "Resume experiment with: Tuner.restore(...)" after Ctrl-C is not how this sweep resumes: the summary
    # says how.
    quiet = [logging.getLogger(name) for name in ("ray.tune.tune", "ray.tune.execution.tune_controller",
                                                  "ray.tune.analysis.experiment_analysis",
                                                  "ray.tune.execution.experiment_state")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.CRITICAL)
    try:
        with _stop_on_sigterm(on_stop):  # after ray.init, whose own SIGTERM handler aborts the process
            tuner.fit()
    except (OSError, EOFError) as exc:
        # Tune's own bookkeeping under <results>/tune failed, e.g. reading back an error file truncated when the
        # disk filled up. Nothing reads that state to resume: the results dir says what finished.
        out(f"warning: Ray Tune could not keep its experiment state under {Path(spec.results_dir) / TUNE_DIR}: "
            f"{type(exc).__name__}: {exc}")
    finally:
        for log, level in zip(quiet, levels):
            log.setLevel(level)
    compactor.finish()
    # a trial ended by the stop did not fail: its runs are recorded as interrupted (`_record_interrupted`)
    return {run.run_id: error for t in trials if (error := callback.errors.get(t.key)) is not None
            and not _STOPPED_ERROR.match(error) for run in t.runs}


def _outcome(spec: SweepSpec, runs: list[Run], skipped: int, interrupted: list[str], not_started: list[str],
             errors: dict[str, str], out: Callable[[str], None], command: str) -> SweepOutcome:
    found = recorded_rows(spec, runs)
    rows = {r.run_id: found.get(r.run_id, {}) for r in runs}
    failed = {rid: (row.get("error") or "unknown error") for rid, row in rows.items()
              if row.get("status") == "failed" and rid not in interrupted}
    # a failure the results dir could not record (disk full) is a failure all the same
    failed.update({rid: error for rid, error in errors.items()
                   if rid not in failed and rows[rid].get("status") != "finished"})
    done = [rid for rid, row in rows.items() if row.get("status") == "finished"]
    write_sweep_record(spec, runs, done)
    finished = len(done)
    table = summary_table(spec.results_dir, spec.name)
    outcome = SweepOutcome(total=len(runs), skipped=skipped, finished=finished, failed=failed,
                           interrupted=interrupted, not_started=not_started, table=table)
    out("")
    out(table)
    out("")
    out(f"{finished}/{len(runs)} runs finished, {len(failed)} failed, {len(interrupted)} interrupted, "
        f"{len(not_started)} not started")
    if failed:
        out("errors:")
        for error, count in _count(failed.values()):
            out(f"  {count} run(s): {error}")
    if finished < len(runs):
        out(f"continue with: {command} --resume   (finished runs are skipped, the others go on from their "
            f"last complete part)")
    out(dashboard_hint(spec.results_dir))
    return outcome


def _count(errors: Any) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for e in errors:
        line = e.strip().splitlines()[-1] if e.strip() else e
        counts[line] = counts.get(line, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


__all__ = ["run_sweep", "SweepOutcome", "NoGPU", "SharedStorageError", "SweepLocked", "NeedsConfirmation",
           "ClusterUnreachable", "LARGE_SWEEP", "check_address"]
