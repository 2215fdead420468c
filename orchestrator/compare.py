"""`bca compare METHOD`: a method against every built-in one on a standard suite, as a leaderboard with evidence.

The suite is an ordinary sweep (named compare-<method>, in the results dir like any other, so it grows and
resumes as sweeps do): the CLIP-like synthetic presets under an i.i.d., a label-correlated (Dirichlet) and a
class-by-class (separate) stream, `orders` independent orders each; or, given a data root, the user's datasets
in `orders` i.i.d. orders. Every method runs with its card's defaults. The leaderboard ranks the methods by their
mean gain over CLIP across the suite's runs, each run paired with CLIP on the same samples in the same order,
and says which differences to the best method are significant (orchestrator.results.stats; docs/statistics.md).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from orchestrator import registry
from orchestrator.registry.backbones import names_teacher
from orchestrator.results import metrics, stats

PRESETS = ("fine_grained", "imagenet_like")
STREAMS: tuple[Any, ...] = ("iid", {"dirichlet": {"gamma": 0.01}}, "separate")
DEFAULT_ORDERS = 3
DEFAULT_SAMPLES = 1000  # per synthetic stream: long enough for the adaptive methods to move, short enough to be quick


def _runs_on_one_view(card: registry.MethodCard) -> bool:
    """Whether a method runs on the synthetic presets, which have a single view per sample and no images (a method
    adapting the image encoder needs them)."""
    return not card.views_everywhere and card.image_encoder is None


def _needs_more_than_the_backbone(card: registry.MethodCard) -> str | None:
    """Why a method cannot run on the real-data suite's one backbone, if it cannot: it reads an auxiliary encoder's
    features (which the suite's backbone does not name) or a CLIP teacher's (a second backbone's weights), or it
    starts from files of its own (PromptAlign: a MaPLe context and its source statistics)."""
    if card.tunes_maple:
        return "tunes MaPLe's prompts from a MaPLe context file and PromptAlign's source statistics"
    if card.auxiliary:
        return f"reads the {', '.join(card.auxiliary)} auxiliary encoder's features"
    if names_teacher(card):
        return "reads a CLIP teacher's features (a second backbone's weights)"
    return None


def left_out(field: Sequence[str], data_root: str | Path | None) -> dict[str, str]:
    """The built-in methods the suite leaves out on real data, each with why (a sweep of its own runs them)."""
    if data_root is None:
        return {}
    reasons = {name: _needs_more_than_the_backbone(registry.method_card(name)) for name in field}
    return {name: why for name, why in reasons.items() if why}


def resolve_method(method: str) -> tuple[str, list[str], list[str]]:
    """(method name, plugin modules, the field: the methods registered before the plugin): METHOD is a registered
    name, or a module that registers exactly one new method. Raises ValueError saying what was expected."""
    before = registry.method_names()
    if method in before:
        return method, [], before
    try:
        registry.load_plugins([method])
    except ValueError as exc:  # names the module and why it cannot be imported
        raise ValueError(f"METHOD {method!r} is not a registered method ({', '.join(before)}), nor a plugin module "
                         f"that registers one: {exc}") from None
    added = [name for name in registry.method_names() if name not in before]
    if len(added) != 1:
        raise ValueError(f"METHOD {method!r}: expected a registered method ({', '.join(before)}) or a "
                         f"plugin module that registers one method; it registered {len(added)}"
                         + (f" ({', '.join(added)})" if added else ""))
    return added[0], [method], before


def suite_spec(method: str, plugins: Sequence[str], field: Sequence[str], *, results_dir: str | Path,
               orders: int = DEFAULT_ORDERS, samples: int = DEFAULT_SAMPLES, data_root: str | Path | None = None,
               datasets: Sequence[str] = (), cache_dir: str | Path | None = None,
               backbone: str = "ViT-B-16", pretrained: str = "openai") -> dict[str, Any]:
    """The suite as a sweep spec document (validated by the sweep's own loader)."""
    synthetic = data_root is None
    builtins = list(field)
    if synthetic:
        card = registry.method_card(method)
        if not _runs_on_one_view(card):
            raise ValueError(f"METHOD {method!r} takes augmented views on every dataset, which the synthetic suite "
                             "lacks; compare it on real datasets with --data-root and --dataset")
        builtins = [name for name in builtins if _runs_on_one_view(registry.method_card(name))]
        data: list[Any] = [{"synthetic": preset, "n": samples} for preset in PRESETS]
    else:
        if not datasets:
            raise ValueError("--data-root needs at least one --dataset to compare on")
        why = _needs_more_than_the_backbone(registry.method_card(method))
        if why:
            raise ValueError(f"METHOD {method!r} {why}, which the suite's one backbone does not give; compare it in "
                             f"a sweep whose backbones name them (docs/real-data.md)")
        dropped = left_out(builtins, data_root)
        builtins = [name for name in builtins if name not in dropped]
        data = list(datasets)
    names = list(dict.fromkeys([*builtins, method]))
    spec: dict[str, Any] = {
        "name": f"compare-{method}", "description": f"bca compare {method}: every built-in method beside it",
        "results_dir": str(Path(results_dir).resolve()), "datasets": data,
        "methods": [{"method": name} for name in names], "seeds": [1],
        "orders": orders, "resources": {"cpus": 1}, "plugins": list(plugins),
    }
    if synthetic:
        spec["stream"] = list(STREAMS)
    else:
        if cache_dir is None:
            raise ValueError("--data-root needs --cache-dir, the feature cache's folder (created if missing)")
        spec.update(data_root=str(Path(data_root).resolve()), cache_dir=str(Path(cache_dir).resolve()),
                    backbones=[{"model": backbone, "pretrained": pretrained}])
        if orders > 1:
            spec["stream"] = "iid"
    return spec


# ---------------------------------------------------------------------------------------------- leaderboard
def leaderboard(db: Any, sweep: str) -> pd.DataFrame:
    """One row per method of the sweep's finished complete runs, best first: mean gain over CLIP (points) with
    its 95% interval, worst 10% of the per-run gains, ECE, samples/s (as the runs recorded it: in a pack, the
    pack's speed, each run an equal share of the pass), and the difference to the best method with its
    Holm-adjusted p-value (None for the best)."""
    baseline = registry.baseline_method()
    runs = db.df("SELECT a.run_id, a.method, a.setting_id, a.dataset, a.seed, "
                 "coalesce(a.order_index, 0) AS order_index, a.ece, r.samples_per_s "
                 "FROM accuracy a JOIN runs r USING (run_id) "
                 "WHERE a.sweep = $sweep AND a.status = 'finished' AND a.complete", {"sweep": sweep})
    if runs.empty:
        return pd.DataFrame()
    ids = set(runs["run_id"])

    def against(method: str) -> pd.DataFrame:
        """The sweep's runs paired with `method`'s finished complete run of the sweep on the same samples."""
        pairs = db.df("SELECT p.run_id, p.baseline_run, p.helped, p.hurt, p.n, p.gain FROM paired_against($b) p "
                      "WHERE p.gain IS NOT NULL", {"b": method})
        return runs.merge(pairs[pairs["run_id"].isin(ids) & pairs["baseline_run"].isin(ids)], on="run_id")

    over_clip = against(baseline)
    rows = []
    for method, part in runs.groupby("method"):
        gains = over_clip[over_clip["method"] == method]
        row = {"method": method, "label": registry.method_label(method), "runs": len(part),
               "ece": part["ece"].mean(), "samples_per_s": part["samples_per_s"].mean()}
        if method == baseline:
            row.update(gain=0.0, gain_low=0.0, gain_high=0.0, worst10=0.0)
        elif len(gains):
            s = _across(gains)
            worst = gains["gain"].nsmallest(metrics.worst_count(len(gains))).mean()
            row.update(gain=100 * s.mean, gain_low=100 * s.ci_low, gain_high=100 * s.ci_high, worst10=worst)
        rows.append(row)
    board = pd.DataFrame(rows).sort_values("gain", ascending=False, na_position="last", kind="stable")
    board.insert(0, "rank", range(1, len(board) + 1))
    best = board.iloc[0]["method"]
    diffs = against(best)
    p_raw, delta = {}, {}
    for method in board["method"]:
        d = diffs[diffs["method"] == method]
        if method == best or d.empty:
            continue
        s = _across(d)
        p_raw[method], delta[method] = s.p, 100 * s.mean
    adjusted = dict(zip(p_raw, stats.holm(list(p_raw.values()))))
    board["vs_best"] = board["method"].map(delta)
    board["p_vs_best"] = board["method"].map(adjusted)
    return board.reset_index(drop=True)


def _across(pairs: pd.DataFrame) -> stats.GainSummary:
    """stats.across_runs over a method's paired runs of the suite: each (seed, order) a replicate averaged over the
    suite's settings, each dataset a test set (its streams share the images)."""
    return stats.across_runs(pairs["helped"], pairs["hurt"], pairs["n"],
                             list(zip(pairs["seed"], pairs["order_index"])), pairs["dataset"].tolist())


def _verdict(row: pd.Series, best: str) -> str:
    if row["method"] == best:
        return "best"
    p = row["p_vs_best"]
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "—"
    word = "worse" if p <= stats.ALPHA else "not significantly different"
    return f"{word} ({row['vs_best']:+.2f}, p={p:.2g})"


def render(board: pd.DataFrame, sweep: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"Leaderboard — sweep {sweep}: gain over CLIP in accuracy points, mean over the suite's "
                  "runs", title_justify="left", header_style="bold")
    for name in ("rank", "method", "gain over CLIP [95% interval]", "worst 10%", "ECE (%)", "samples/s (pack)",
                 "runs", "against the best (Holm)"):
        table.add_column(Text(name), justify="left" if name in ("method", "against the best (Holm)") else "right")
    best = board.iloc[0]["method"] if len(board) else None
    for _, row in board.iterrows():
        gain = "—" if pd.isna(row.get("gain")) else (
            f"{row['gain']:+.2f} [{row['gain_low']:+.2f}, {row['gain_high']:+.2f}]")
        worst = "—" if pd.isna(row.get("worst10")) else f"{row['worst10']:+.2f}"
        table.add_row(str(row["rank"]), Text(row["label"]), gain, worst, f"{row['ece']:.2f}",
                      f"{row['samples_per_s']:,.0f}", str(row["runs"]), Text(_verdict(row, best)))
    table.caption = Text("interval: over orders and test samples (one order: the pooled paired bootstrap); "
                         "against the best: the same paired test, Holm over the methods, "
                         f"significant at {stats.ALPHA:g}; samples/s (pack): the speed of the trials that ran the "
                         "method's runs, several methods' runs to a trial in one pass, not the method's alone "
                         "(docs/statistics.md)")
    table.caption_justify = "left"
    return table


# ---------------------------------------------------------------------------------------------- command
def compare_command(method: str, *, results_dir: Path, orders: int, samples: int, data_root: Path | None,
                    datasets: Sequence[str], cache_dir: Path | None, backbone: str, pretrained: str, dry_run: bool,
                    out: Callable[[str], None] = print) -> int:
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import wide_console
    from orchestrator.sweep.load import SpecError, validate_spec
    from orchestrator.sweep.plan import expand
    from orchestrator.sweep.record import sweep_record_path
    from orchestrator.sweep.runner import NeedsConfirmation, NoGPU, SharedStorageError, SweepLocked, run_sweep

    try:
        name, plugins, field = resolve_method(method)
        document = suite_spec(name, plugins, field, results_dir=results_dir, orders=orders, samples=samples,
                              data_root=data_root, datasets=datasets, cache_dir=cache_dir, backbone=backbone,
                              pretrained=pretrained)
        spec = validate_spec(document, source=f"bca compare {method}")
        runs = expand(spec)
    except (ValueError, SpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for other, why in left_out(field, data_root).items():
        out(f"left out: {registry.method_label(other)} {why}, which the suite's one backbone does not give")
    if dry_run:
        from orchestrator.sweep.dryrun import dry_run as plan_of

        try:
            lines = plan_of(spec, runs)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for line in lines:
            out(line)
        return 0
    resume = sweep_record_path(spec.results_dir, spec.name).exists()
    try:
        outcome = run_sweep(spec, resume=resume, out=out, command=f"bca compare {method}", runs=runs)
    except (SpecError, NoGPU, SharedStorageError, SweepLocked, NeedsConfirmation) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: everything written so far is kept; bca compare {method} goes on from there",
              file=sys.stderr)
        return 130
    with ResultsDB(spec.results_dir) as db:
        board = leaderboard(db, spec.name)
    if board.empty:
        print(f"error: no finished runs in sweep {spec.name}", file=sys.stderr)
        return 1
    wide_console().print(render(board, spec.name))
    return 0 if outcome.ok else 1
