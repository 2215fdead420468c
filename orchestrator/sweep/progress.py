"""What a person watching a sweep sees: one line per finished trial with done/total and ETA, retries and
errors as they happen, and at the end the results module's method x dataset table (`summary_table`).

Runs, not trials, are counted (a packed trial finishes several runs at once). The ETA is the elapsed time per
finished run times the runs left, measured from the first trial start so Ray's start-up does not inflate it.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections import defaultdict
from typing import Any, Callable

from ray import tune

from orchestrator.sweep.plan import Run, Trial


def format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def run_label(run: Run, varying: dict[str, tuple[str, ...]]) -> str:
    """'bca tau=0.2 n1=30000': the method with the hparams that vary for it in this sweep."""
    config = run.config
    keys = varying.get(config["method"], ())
    return " ".join([config["method"]] + [f"{k}={_short(config['hparams'][k])}" for k in keys])


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def varying_hparams(runs: list[Run]) -> dict[str, tuple[str, ...]]:
    """Per method, the hparams that take more than one value among the runs (in a stable order)."""
    values: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for run in runs:
        for k, v in run.config["hparams"].items():
            values[run.config["method"]][k].add(repr(v))
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
    return line if len(line) <= 300 else line[:297] + "..."


def trial_error(trial: Any) -> str:
    """The trial's latest error, summarised; read from the driver's local error file (Tune syncs the copy in
    storage later), falling back to storage."""
    path = getattr(trial, "error_file", None)
    text = None
    if path and os.path.isfile(path):
        with open(path) as f:
            text = "Failure #" + f.read().split("Failure #")[-1]  # the latest attempt's error
    return summarise_error(text if text else trial.get_error())


class ProgressCallback(tune.Callback):
    """Prints sweep progress from the driver; collects errors for the final summary."""

    def __init__(self, trials: list[Trial], all_runs: list[Run], *, already_done: int = 0,
                 out: Callable[[str], None] = print, on_failed: Callable[[Trial, str], None] | None = None) -> None:
        self.trials = {t.key: t for t in trials}
        self.total = already_done + sum(len(t.runs) for t in trials)
        self.done = already_done
        self.started_with = already_done
        self.varying = varying_hparams(all_runs)
        self.out = out
        self.on_failed = on_failed
        self.errors: dict[str, str] = {}
        self.retries = 0
        self.t0: float | None = None

    def _trial(self, trial: Any) -> Trial | None:
        return self.trials.get(trial.config.get("trial"))

    def _eta(self) -> str:
        finished_now = self.done - self.started_with
        if self.t0 is None or finished_now <= 0:
            return "?"
        per_run = (time.monotonic() - self.t0) / finished_now
        return format_seconds(per_run * (self.total - self.done))

    def _describe(self, plan: Trial) -> str:
        first = plan.runs[0]
        what = run_label(first, self.varying) if len(plan.runs) == 1 else f"pack of {len(plan.runs)} runs"
        return f"{what} | {first.config['backbone']} {first.config['dataset']} seed={first.config['seed']}"

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.t0 is None:
            self.t0 = time.monotonic()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        plan = self._trial(trial)
        if plan is None:
            return
        result = trial.last_result or {}
        if result.get("error"):  # a deterministic error, reported instead of raised so Tune does not retry it
            self._failed(plan, summarise_error(result["error"]))
            return
        self.done += len(plan.runs)
        acc = result.get("accuracy")
        parts = [f"[{self.done}/{self.total}]", self._describe(plan)]
        if acc is not None and result.get("n_runs", 0) > 0:
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
        error = trial_error(trial)
        self.out(f"retry: {self._describe(plan) if plan else trial} failed ({error}); "
                 f"retrying from its last complete part")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        plan = self._trial(trial)
        if plan is not None:
            self._failed(plan, trial_error(trial))

    def _failed(self, plan: Trial, error: str) -> None:
        self.done += len(plan.runs)
        self.errors[plan.key] = error
        if self.on_failed is not None:
            self.on_failed(plan, error)
        self.out(f"[{self.done}/{self.total}] FAILED {self._describe(plan)}: {error}  ETA {self._eta()}")



def summary_table(results_dir: str, sweep: str) -> str:
    """The sweep's method x dataset accuracy table (mean ± std over seeds, gain over CLIP) as plain text,
    from the results module's report (finished runs only)."""
    import io

    from orchestrator.results.report import method_dataset_table, wide_console

    table = method_dataset_table(results_dir, sweep=sweep)
    if table.empty:
        return "no finished runs to tabulate yet"
    buffer = io.StringIO()
    wide_console(file=buffer).print(table.render())
    return buffer.getvalue().rstrip()
