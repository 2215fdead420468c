"""The figures of docs/reliability.md: run the fault-injection and bad-input tests, count what was
injected and survived, what bad input was tried, and how many rows were lost.

    python -m benchmarks.reliability            # tests/reliability plus the related tests of other modules
    python -m benchmarks.reliability --own      # tests/reliability only (about 4 minutes on 2 cores)

Counts come from two places. tests/reliability records each fault and bad input in a ledger once the test's
assertions passed (BCA_RELIABILITY_LEDGER names the JSON file; see tests/reliability/conftest.py), with every
run's rows checked against an uninterrupted run. The related tests elsewhere (the sweep's kill/resume tests,
the writer's disk-full tests, the bad-spec table, the refused-SQL table, ...) are counted by name below when
they pass. A test that fails or is skipped is listed and counts nothing; the exit code is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LEDGER_ENV = "BCA_RELIABILITY_LEDGER"
OWN = "tests/reliability"

# Related tests of other modules: node id prefix (parameters stripped) -> (category, what it injects or tries).
RELATED = {
    "tests/test_sweep_ray.py::test_trial_worker_sigkilled_mid_run":
        ("fault", "trial worker SIGKILLed between parts, retried in the sweep"),
    "tests/test_sweep_ray.py::test_failed_trial_is_recorded_then_resumed":
        ("fault", "trial SIGKILLed with no retries left, recorded, resumed"),
    "tests/test_sweep_ray.py::test_driver_sigkilled_then_resume":
        ("fault", "driver SIGKILLed mid-run, then bca sweep --resume"),
    "tests/test_sweep_ray.py::test_same_spec_and_seed":
        ("determinism", "same spec and seed twice: identical rows; stored order replays"),
    "tests/test_results_writer.py::test_failed_write_leaves_no_file":
        ("fault", "ENOSPC half-way through a part (writer)"),
    "tests/test_results_writer.py::test_file_size_limit":
        ("fault", "RLIMIT_FSIZE in a real process (writer)"),
    "tests/test_results_writer.py::test_real_full_disk":
        ("fault", "writer filling a 256 KB tmpfs"),
    "tests/test_results_writer.py::test_unwritable_results_dir":
        ("fault", "a file where the results dir should be (writer)"),
    "tests/test_results_writer.py::test_two_processes_writing_one_run":
        ("fault", "two processes writing one run"),
    "tests/test_results_writer.py::test_bad_part_ends_the_resume_prefix":
        ("fault", "bad part inside a run being resumed"),
    "tests/test_feature_cache.py::test_two_processes_asking_at_once":
        ("fault", "two processes asking for one feature-cache entry"),
    "tests/test_feature_cache.py::test_an_interrupted_encode":
        ("fault", "encode interrupted half-way"),
    "tests/test_feature_cache.py::test_unreadable_images_are_recorded":
        ("bad_input", "undecodable and missing image files"),
    "tests/test_results_verify.py::test_gap":
        ("bad_input", "results with a gap in a run's rows"),
    "tests/test_results_verify.py::test_overlapping_parts":
        ("bad_input", "results with overlapping parts"),
    "tests/test_results_verify.py::test_rows_copied_into_another":
        ("bad_input", "rows copied into another run's folder"),
    "tests/test_results_verify.py::test_part_inconsistent_with_its_name":
        ("bad_input", "part whose rows disagree with its name"),
    "tests/test_results_verify.py::test_rows_without_a_run_row":
        ("bad_input", "rows without a runs-table row, bad runs file"),
    "tests/test_sweep_spec.py::test_malformed_spec_names_field":
        ("bad_spec", "malformed sweep spec (table)"),
    "tests/test_results_safety.py::test_refused_statements":
        ("sql_refused", "SQL that writes or reads outside (table)"),
    "tests/test_dashboard_browser.py::test_dashboard_in_chromium":
        ("security", "dashboard listens on 127.0.0.1 only"),
}


class Outcomes:
    """pytest plugin: every test's outcome by node id."""

    def __init__(self) -> None:
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.outcome[report.nodeid] = report.outcome
        elif report.outcome != "passed":  # an error or a skip in setup/teardown
            self.outcome[report.nodeid] = "skipped" if report.skipped else "failed"


def _related_counts(outcomes: dict[str, str]) -> tuple[Counter, dict[str, list[str]], list[str]]:
    counts: Counter = Counter()
    names: dict[str, list[str]] = {}
    missing = []
    for prefix, (category, label) in RELATED.items():
        hits = [(nid, out) for nid, out in outcomes.items() if nid.split("[")[0].startswith(prefix)]
        passed = sum(out == "passed" for _, out in hits)
        if not hits:
            missing.append(prefix)
        counts[category] += passed
        if passed:
            names.setdefault(category, []).append(f"{label}" + (f" ({passed} cases)" if passed > 1 else ""))
    return counts, names, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--own", action="store_true", help="run tests/reliability only")
    args, extra = parser.parse_known_args(argv)
    targets = [OWN] if args.own else [OWN, *sorted({p.split("::")[0] for p in RELATED})]
    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="bca-reliability-") as tmp:
        ledger_path = Path(tmp) / "ledger.json"
        os.environ[LEDGER_ENV] = str(ledger_path)
        plugin = Outcomes()
        code = pytest.main(["-q", "-p", "no:cacheprovider", *targets, *extra], plugins=[plugin])
        ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else []

    own_faults = [e for e in ledger if e["kind"] == "fault"]
    own_bad = [e for e in ledger if e["kind"] == "bad_input"]
    own_determinism = [e for e in ledger if e["kind"] == "determinism"]
    rows = [e for e in ledger if e["kind"] == "rows"]
    lost = sum(e["expected"] - e["distinct"] for e in rows)
    duplicated = sum(e["duplicates"] for e in rows)
    related, related_names, missing = ([Counter(), {}, []] if args.own else _related_counts(plugin.outcome))
    failed = sorted(n for n, o in plugin.outcome.items() if o == "failed")
    skipped = sorted(n for n, o in plugin.outcome.items() if o == "skipped")

    faults = len(own_faults) + related["fault"]
    bad_inputs = len(own_bad) + related["bad_input"]
    print("\n" + "=" * 100)
    print("Reliability figures (docs/reliability.md)")
    print("=" * 100)
    print(f"faults injected and survived:     {faults}  ({len(own_faults)} in tests/reliability, "
          f"{related['fault']} in the modules' own tests)")
    how = ", ".join(f"{n} {outcome}" for outcome, n in Counter(e["outcome"] for e in own_bad).most_common())
    print(f"bad inputs tried and handled:     {bad_inputs}  (in tests/reliability: {how})")
    if not args.own:
        print(f"malformed sweep specs refused:    {related['bad_spec']}")
        print(f"refused SQL statements (table):   {related['sql_refused']}")
        print(f"determinism checks passed:        {related['determinism'] + len(own_determinism)}")
        print(f"security checks passed:           {related['security']}")
    print(f"runs checked row by row:          {len(rows)} ({sum(e['expected'] for e in rows)} rows against an "
          f"uninterrupted run)")
    print(f"rows lost:                        {lost}")
    print(f"rows duplicated:                  {duplicated}")
    print("\nfaults:")
    for e in own_faults:
        print(f"  - {e['name']}")
    for label in related_names.get("fault", []):
        print(f"  - {label}")
    print("\nbad inputs:")
    for e in own_bad:
        print(f"  - {e['name']}: {e['outcome']}")
    for label in related_names.get("bad_input", []):
        print(f"  - {label}")
    if missing:
        print(f"\nnot found (renamed or removed? update RELATED in {Path(__file__).name}): {', '.join(missing)}")
    if skipped:
        print(f"\nskipped ({len(skipped)}): {', '.join(skipped)}")
    if failed:
        print(f"\nFAILED ({len(failed)}): {', '.join(failed)}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
