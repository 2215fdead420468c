"""What a person watching a sweep sees: one line per finished trial with done/total and ETA, a line now and
then for each long trial still running (encoding: images done, images/s and time left; adapting: samples
done), retries and errors as they happen, and at the end the results module's method x dataset table
(`summary_table`).

Runs, not trials, are counted (a packed trial finishes several runs at once). The ETA weighs each run by what
it is measured to cost: a method's seconds per sample (from its finished runs; the mean of the measured
methods until it has one) times its dataset's length, since methods differ by orders of magnitude (TDA's cache
against BCA's closed-form update). Elapsed wall time per unit of cost done so far, running trials' done share
included, times the cost left is the ETA, measured from the first trial start so Ray's start-up does not count.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import statistics
import sys
import time
from collections import defaultdict
from importlib.metadata import distribution, packages_distributions
from pathlib import Path
from typing import Any, Callable

from ray import tune

from orchestrator.data.streams import stream_label
from orchestrator.sweep.plan import Run, Trial, computed_runs


def format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def run_label(run: Run, varying: dict[str, tuple[str, ...]]) -> str:
    """'bca tau=0.2 n1=30000': the method with the hparams that vary for it in this sweep."""
    keys, hparams = varying.get(run.method, ()), run.hparams
    return " ".join([run.method] + [f"{k}={_short(hparams[k])}" for k in keys])


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def varying_hparams(runs: list[Run]) -> dict[str, tuple[str, ...]]:
    """Per method, the hparams that take more than one value among the runs (in a stable order)."""
    values: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for run in runs:
        for k, v in run.hparams.items():
            values[run.method][k].add(repr(v))
    return {m: tuple(sorted(k for k, vs in hp.items() if len(vs) > 1)) for m, hp in values.items()}


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def summarise_error(text: str | None) -> str:
    """One line for a trial's error text: the exception line of a traceback, or for a worker that died
    (SIGKILL, out of memory, crash) what Ray says about the process, without its generic advice."""
    if not text:
        return "unknown error"
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip() and not ln.startswith("Failure #")]
    died = next((ln for ln in lines if ln.startswith("The actor is dead because")), None)
    if died is not None:
        detail = died.split(" Some common causes")[0]
        line = f"worker process died (killed, out of memory or crashed): {detail}"
    else:
        line = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[0] if lines else "unknown error")
    return line  # whole: a remedy cut short is no remedy


def trial_error(trial: Any) -> str:
    """The trial's latest error, summarised; read from the driver's local error file (Tune syncs the copy in
    storage later), falling back to storage."""
    path = getattr(trial, "error_file", None)
    text = None
    if path and os.path.isfile(path):
        with open(path) as f:
            text = "Failure #" + f.read().split("Failure #")[-1]  # the latest attempt's error
    return summarise_error(text if text else trial.get_error())


PROGRESS_KEY = "progress"  # a result carrying it is a running trial's progress, not its final metrics
_UNITS = {"encoding": "images", "encoding prompts": "prompts", "adapting": "samples"}


class TrialProgress:
    """Inside a trial: turns (stage, done, total) calls into progress results for the driver, at most one per
    `every_s` seconds of a stage (0: every call), the first once that much of the stage has passed."""

    def __init__(self, report: Callable[[dict[str, Any]], None], every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.report, self.every_s, self.clock = report, every_s, clock
        self.stage: str | None = None
        self.began = self.last = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        if stage != self.stage:
            self.stage, self.began, self.last = stage, now, now
        if now - self.last < self.every_s:
            return
        self.last = now
        elapsed = now - self.began
        self.report({PROGRESS_KEY: stage, "progress_done": done, "progress_total": total,
                     "progress_rate": done / elapsed if elapsed > 0 else float("nan")})


class ProgressCallback(tune.Callback):
    """Prints sweep progress from the driver; collects errors for the final summary."""

    def __init__(self, trials: list[Trial], all_runs: list[Run], *, already_done: int = 0,
                 out: Callable[[str], None] = print, on_failed: Callable[[Trial, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.trials = {t.key: t for t in trials}
        self.total = already_done + len({run.run_id for t in trials for run in t.runs})  # a sharded run once
        self.done = already_done
        self.varying = varying_hparams(all_runs)
        self.out = out
        self.on_failed = on_failed
        self.clock = clock
        self.errors: dict[str, str] = {}
        self.retries = 0
        self.t0: float | None = None
        self.ended: set[str] = set()                          # trials finished or failed in this invocation
        self.running: dict[str, float] = {}                   # trial key -> share of its stream adapted
        self.sample_cost: dict[str, list[float]] = defaultdict(list)  # method -> measured seconds per sample
        self.length: dict[str, int] = {}                      # dataset -> stream length
        self.shards_ended: dict[str, int] = defaultdict(int)  # sharded run -> its shard trials ended
        self.counted: set[str] = set()                         # sharded runs counted done (finished or failed)

    def _trial(self, trial: Any) -> Trial | None:
        return self.trials.get(trial.config.get("trial"))

    def _cost(self, run: Run) -> float:
        """Estimated seconds of a run: its method's measured seconds per sample times its stream's length."""
        costs = {m: statistics.fmean(c) for m, c in self.sample_cost.items()}
        per_sample = costs.get(run.method, statistics.fmean(costs.values()) if costs else 1.0)
        n = self.length.get(run.source.dataset, statistics.fmean(self.length.values()) if self.length else 1.0)
        return per_sample * n

    def _eta(self) -> str:
        if self.t0 is None:
            return "?"
        done = left = 0.0
        for key, plan in self.trials.items():
            cost = sum(self._cost(run) for run in computed_runs(plan)) / (plan.shard.count if plan.shard else 1)
            share = 1.0 if key in self.ended else self.running.get(key, 0.0)
            done += share * cost
            left += (1.0 - share) * cost
        if done <= 0:
            return "?"
        return format_seconds((self.clock() - self.t0) * left / done)

    def _measure(self, plan: Trial, result: dict[str, Any]) -> None:
        if result.get("n_runs", 0) <= 0 or not result.get("samples_per_s"):
            return
        if result.get("n_samples"):
            self.length[plan.runs[0].source.dataset] = int(result["n_samples"])
        for method in {run.method for run in plan.runs}:
            self.sample_cost[method].append(1.0 / result["samples_per_s"])

    def _describe(self, plan: Trial) -> str:
        """'bca tau=0.3 | synthetic synthetic-fine_grained iid seed=1 order=2': the stream and order tell apart
        the runs of one configuration (a trial's runs share its data source; 'orders=0-2' where they span
        several of its orders)."""
        first = plan.runs[0]
        what = run_label(first, self.varying) if len(plan.runs) == 1 else f"pack of {len(plan.runs)} runs"
        if plan.replay:
            what += f" ({len(plan.replay)} computed, replayed over their orders)"
        if plan.shard is not None:
            what += f" ({plan.shard.label})"
        config = first.config
        where = [config.backbone, config.dataset]
        if config.stream is not None:
            where.append(stream_label(config.stream))
        if len(plan.runs) == 1 and first.batch_size != 1:
            where.append(f"batch={first.batch_size}")
        where.append(f"seed={config.seed}")
        orders = sorted({run.source.order_index for run in plan.runs})
        if len(orders) > 1:
            where.append(f"orders={orders[0]}-{orders[-1]}" if orders == list(range(orders[0], orders[-1] + 1))
                         else f"orders={','.join(map(str, orders))}")
        elif config.order_index is not None:
            where.append(f"order={config.order_index}")
        return f"{what} | {' '.join(where)}"

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.t0 is None:
            self.t0 = self.clock()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        """A running trial's progress: '  bca tau=0.3 | ... seed=1: adapting 20,000/50,000 samples ...'."""
        plan = self._trial(trial)
        stage = result.get(PROGRESS_KEY)
        if plan is None or stage is None:
            return
        done, total, rate = result["progress_done"], result["progress_total"], result["progress_rate"]
        unit = _UNITS.get(stage, "items")
        line = f"  {self._describe(plan)}: {stage} {done:,}/{total:,} {unit}"
        if math.isfinite(rate) and rate > 0:
            line += f", {rate:,.0f} {unit}/s, {format_seconds((total - done) / rate)} left"
        if stage == "adapting":
            self.length[plan.runs[0].source.dataset] = total
            self.running[plan.key] = done / total if total else 0.0
        self.out(f"{line}  ETA {self._eta()}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        plan = self._trial(trial)
        if plan is None:
            return
        result = trial.last_result or {}
        if result.get("error"):  # a deterministic error, reported instead of raised so Tune does not retry it
            self._failed(plan, summarise_error(result["error"]))
            return
        self.done += self._runs_ended(plan, failed=False)
        self.ended.add(plan.key)
        self.running.pop(plan.key, None)
        self._measure(plan, result)
        acc = result.get("accuracy")
        parts = [f"[{self.done}/{self.total}]", self._describe(plan)]
        if plan.shard is not None and result.get("n_runs", 0) > 0 and not result.get("finished"):
            parts.append(f"{result['rows_written']:,} rows")  # the run's accuracy comes with its last shard
            parts.append(f"{result.get('samples_per_s', float('nan')):,.0f} samples/s")
            if result.get("resumed_from"):
                parts.append(f"resumed at row {result['resumed_from']}")
        elif acc is not None and result.get("n_runs", 0) > 0:
            parts.append(f"acc {acc:.2f}%" + (" (mean)" if len(plan.runs) > 1 else ""))
            parts.append(f"{result.get('samples_per_s', float('nan')):,.0f} samples/s")
            if result.get("resumed_from"):
                parts.append(f"resumed at row {result['resumed_from']}")
        elif result.get("n_runs") == 0:
            parts.append("already finished")
        parts.append(f"ETA {self._eta()}")
        self.out("  ".join(parts))

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        plan = self._trial(trial)
        self.retries += 1
        if plan is not None:
            self.running.pop(plan.key, None)  # the retry replays its stream from the start
        error = trial_error(trial)
        self.out(f"retry: {self._describe(plan) if plan else trial} failed ({error}); "
                 f"retrying from its last complete part")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        plan = self._trial(trial)
        if plan is not None:
            self._failed(plan, trial_error(trial))

    def _runs_ended(self, plan: Trial, failed: bool) -> int:
        """Runs a trial that ended takes to their end: its runs, or for a shard its run once its last shard
        ended (or a shard failed for good)."""
        if plan.shard is None:
            return len(plan.runs)
        run_id = plan.runs[0].run_id
        self.shards_ended[run_id] += 1
        if run_id in self.counted or not (failed or self.shards_ended[run_id] == plan.shard.count):
            return 0
        self.counted.add(run_id)
        return 1

    def _failed(self, plan: Trial, error: str) -> None:
        self.done += self._runs_ended(plan, failed=True)
        self.ended.add(plan.key)
        self.running.pop(plan.key, None)
        self.errors[plan.key] = error
        if self.on_failed is not None:
            self.on_failed(plan, error)
        self.out(f"[{self.done}/{self.total}] FAILED {self._describe(plan)}: {error}  ETA {self._eta()}")


def bca_command() -> str:
    """How to run `bca` from a fresh shell: this environment's script (`.venv/bin/bca` from the checkout, since a
    new shell need not have the venv on its PATH), else the plain name, else the module. The name is the console
    script of this package's distribution (pyproject's [project.scripts])."""
    name = next((ep.name for dist in packages_distributions().get(__name__.split(".")[0], [])
                 for ep in distribution(dist).entry_points if ep.group == "console_scripts"), None)
    script = Path(sys.executable).with_name(name) if name else None
    if script is None or not script.is_file():
        return name or "python -m orchestrator.cli"  # not installed: the module runs the same CLI
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def dashboard_hint(results_dir: str | Path) -> str:
    """The sweep's closing line: the command that opens the dashboard on its results, runnable as printed."""
    return f"open the dashboard: {bca_command()} dashboard --results {shlex.quote(str(results_dir))}"


def summary_table(results_dir: str, sweep: str) -> str:
    """The sweep's method x dataset accuracy table as plain text, from the results module's report: each cell
    with the runs it stands on ('n=2 of 3' and the caption's list where runs failed, were interrupted or lost
    rows; '30 of 40 samples' where images were skipped), gains over CLIP paired on the same runs."""
    import io

    from orchestrator.results.report import method_dataset_table, wide_console

    table = method_dataset_table(results_dir, sweep=sweep)
    if table.empty:
        return "no finished runs to tabulate yet"
    buffer = io.StringIO()
    rendered = table.render()
    wide_console(file=buffer, fit=[rendered]).print(rendered)
    return buffer.getvalue().rstrip()
