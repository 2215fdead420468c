"""The docs say what is true: README.md and docs/*.md, checked against the code and against real results.

- every generated section (methods, datasets, columns, CLI options, benchmark logs) equals its source, and
  `python -m orchestrator.docs` rewrites a stale one;
- every command of a fenced bash block is run here (against the demo's real results) or named with the test
  that runs it elsewhere; every output block under a command or a Python block is what it prints;
- every SQL example is run with `bca query` against the demo's results and checked for what its text claims;
- every YAML spec example validates, and the runnable one plans with `bca sweep --dry-run`;
- every option of an inline `bca ...` command exists; every relative link resolves;
- BCA_DOCS_REFRESH=1 rewrites the output blocks from what the commands print now (after a change of output);
- the reference pages name every spec key and every column of the SQL views;
- nothing in the repository points outside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from dashboard_results import bca_executable
from orchestrator import docs, registry

REPO = Path(__file__).resolve().parents[1]

WIDE = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
# BCA_DOCS_REFRESH=1: rewrite the output blocks from what the commands print now, instead of checking them.
REFRESH = os.environ.get("BCA_DOCS_REFRESH") == "1"
USER_RESULTS = "/home/you/bca/results"  # where the docs' outputs say the reader's results are

# Pages written on other branches, with tests of their own for their commands, code and specs (a plugin's files,
# a spec naming a plugin method): here their links are checked once they exist, and their SQL must run.
PARALLEL = {"adding-a-method.md", "adding-a-dataset.md", "results-store.md", "statistics.md"}
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OWN = [page for page in PAGES if page.name not in PARALLEL]

# Commands of bash blocks that run here, in a copy of the checkout holding the demo's results (exit code 0).
RUN_HERE = {
    "bca report --sweep demo",
    "bca report --sweep demo --metric ece",
    "bca report --sweep demo --tune-on \"order_index = 0\"",
    "bca verify results",
    "bca query --file q.sql --csv > out.csv",
    "bca sweep experiments/demo.yaml --dry-run",
    "bca query \"SELECT method, stream, round(mean, 2) AS acc, n, round(gain, 2) AS gain FROM summary WHERE "
    "dataset = 'synthetic-fine_grained' AND stream = 'iid' ORDER BY acc DESC\"",
}
# Commands too costly or needing what a test machine lacks, each with the tests that run it (file::test, or a
# folder of tests).
ELSEWHERE = {
    "bash scripts/demo.sh": "tests/test_docs.py::test_demo_script_runs_the_demo_spec",
    "bash scripts/test.sh": "tests/test_docs.py::test_test_script_runs_pytest",
    "bca cache experiments/paper_ood.yaml": "tests/test_feature_cache.py::test_bca_cache_from_a_sweep_spec",
    "bca cache --model ViT-B-16 --pretrained openai --dataset imagenet-a --data-root data --cache-dir cache":
        "tests/test_feature_cache.py::test_bca_cache_explicit_args_then_no_op",
    "bca sweep experiments/sharded.yaml --dry-run":
        "tests/test_sweep_shards.py::test_the_docs_sharded_spec_runs_with_the_docs_commands",
    "bca sweep experiments/sharded.yaml": "tests/test_sweep_shards.py::test_the_docs_sharded_spec_runs_with_the_docs_commands",
    "bca sweep experiments/transductive.yaml":
        "tests/test_transductive_report.py::test_the_report_shows_transclip_and_zlap_collapsing_on_few_class_batches",
    "bca report --sweep transductive":
        "tests/test_transductive_report.py::test_the_report_shows_transclip_and_zlap_collapsing_on_few_class_batches",
    # a wrapper that runs tests/reliability and the related tests of other modules (minutes) and counts them
    "python -m benchmarks.reliability": "tests/reliability",
    # the whole study needs a GPU; its quick mode and its test run in minutes
    "python -m benchmarks.study": "tests/test_benchmark_study.py",
    "python -m benchmarks.study --quick": "tests/test_benchmark_study.py",
    # the study's plan (minutes: 39,800 runs)
    "bca sweep experiments/paper_study.yaml --dry-run":
        "tests/test_study_spec.py::test_the_documented_dry_run_plans_the_study_without_its_data",
}


# ------------------------------------------------------------------------------------------------ helpers
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(page: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of a page: (language, text), in order."""
    return FENCE.findall(page.read_text())


def all_blocks(language: str, pages: list[Path] = PAGES) -> list[tuple[Path, str]]:
    return [(page, text) for page in pages for lang, text in blocks(page) if lang == language]


def block_outputs(language: str) -> list[tuple[Path, str, str | None]]:
    """Each block of a language with its output: the untagged block right after it (nothing but blank lines
    between), if any."""
    out = []
    for page in OWN:
        text = page.read_text()
        found = list(FENCE.finditer(text))
        for i, block in enumerate(found):
            if block.group(1) == language:
                after = found[i + 1] if i + 1 < len(found) else None
                adjacent = after and after.group(1) == "" and not text[block.end():after.start()].strip()
                out.append((page, block.group(2), after.group(2) if adjacent else None))
    return out


def commands(text: str) -> list[str]:
    """The commands of a bash block: one per line, comments dropped."""
    return [re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines() if line.strip()
            and not line.lstrip().startswith("#")]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    bca = bca_executable()
    shell = re.sub(r"^bca ", f"{bca} ", command)
    return subprocess.run(shell, shell=True, cwd=cwd, env=WIDE, capture_output=True, text=True, timeout=300)


def table_lines(text: str) -> list[str]:
    """The content lines of printed tables and messages, borders dropped, trailing space stripped."""
    return [line.rstrip() for line in text.splitlines() if line.strip() and line.strip()[0] not in "┏┡└━"]


def replace_block(page: Path, old: str, new: str) -> None:
    """Put new in place of the untagged block whose text is old."""
    text = page.read_text()
    fenced = f"```\n{old}```"
    assert text.count(fenced) == 1, f"{page.name}: the block to refresh is not there exactly once"
    page.write_text(text.replace(fenced, f"```\n{new}```"))


def query(sql: str, results: Path) -> list[dict]:
    done = subprocess.run([bca_executable(), "query", sql, "--json", "--results", str(results)],
                          capture_output=True, text=True, timeout=300, env=WIDE)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str]:
    """A copy of the checkout's experiments/demo.yaml swept with `bca sweep` as scripts/demo.sh does; returns the
    copy's root (holding experiments/ and results/) and the sweep's output. BCA_DOCS_DEMO_DIR keeps it between
    sessions (swept again only when the demo spec changed)."""
    kept = os.environ.get("BCA_DOCS_DEMO_DIR")
    root = Path(kept) if kept else tmp_path_factory.mktemp("docs_demo")
    spec = root / "experiments" / "demo.yaml"
    source = (REPO / "experiments" / "demo.yaml").read_text()
    log = root / "sweep.out"
    if not (kept and spec.is_file() and spec.read_text() == source and log.is_file()):
        shutil.rmtree(root / "results", ignore_errors=True)
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(source)
        done = subprocess.run([bca_executable(), "sweep", "experiments/demo.yaml", "--resume"], cwd=root, env=WIDE,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        log.write_text(done.stdout)
    return root, log.read_text()


@pytest.fixture(scope="module")
def frames(demo, tmp_path_factory) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The demo's sample rows and runs table, exported whole: the SQL examples' answers are computed from them
    in pandas, apart from the SQL."""
    results, out = demo[0] / "results", tmp_path_factory.mktemp("docs_frames")
    tables = []
    for name, sql in (("samples", "SELECT run_id, sample_idx, correct, is_ood, dataset, method FROM samples"),
                      ("runs", "SELECT * FROM runs")):
        done = subprocess.run([bca_executable(), "query", sql, "--parquet", str(out / f"{name}.parquet"),
                               "--results", str(results)], capture_output=True, text=True, timeout=300, env=WIDE)
        assert done.returncode == 0, done.stdout + done.stderr
        tables.append(pq.read_table(out / f"{name}.parquet").to_pandas())
    return tables[0], tables[1]


# ---------------------------------------------------------------------------------------- generated parts
@pytest.mark.parametrize("name", list(docs.SECTIONS))
def test_generated_section_is_its_source(name):
    page = REPO / docs.SECTIONS[name][0]
    assert docs.section(name) in page.read_text(), \
        f"{page.relative_to(REPO)}: the section {name!r} differs from its source; run python -m orchestrator.docs"


def test_the_readme_table_names_every_built_in_method_with_its_family_source_and_cost():
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ", 1)[1] for line in (REPO / "README.md").read_text()
            .split(docs.markers("readme-methods")[0])[1].split(docs.markers("readme-methods")[1])[0].splitlines()
            if line.startswith("| ") and not line.startswith("| family")}
    for card in registry.method_cards():
        if not (isinstance(card.impl, str) and card.impl.startswith("orchestrator.")):
            continue
        row = rows[card.family]
        cell = next(c for c in row.rstrip(" |").split(" · ")
                    if card.label in c.split(": ")[0].replace(" (from the paper)", "").split(", "))
        paper = card.source.startswith("from the paper")
        assert (f"{card.label} (from the paper)" in cell) == paper, cell
        rate = card.cost.samples_per_s
        assert cell.endswith(f"{rate / 1000:.3g}k/s" if rate and rate >= 1000 else f"{rate:.3g}/s" if rate else
                             "text-tower backward per sample" if card.text_encoder else
                             "both towers' backward per sample" if card.tunes_maple else
                             "image-tower backward per batch" if card.image_encoder else "not measured yet"), cell


def test_the_generator_rewrites_a_stale_section(tmp_path):
    for page in {p for p, _ in docs.SECTIONS.values()}:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, tmp_path / page)
    page = tmp_path / docs.SECTIONS["methods-table"][0]
    begin, end = docs.markers("methods-table")
    fresh = page.read_text()
    stale = fresh.replace(docs.section("methods-table"), f"{begin}\n| stale |\n{end}")
    assert stale != fresh
    page.write_text(stale)
    done = subprocess.run([sys.executable, "-m", "orchestrator.docs", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("updated: ") and str(page) in done.stdout
    assert page.read_text() == fresh
    again = subprocess.run([sys.executable, "-m", "orchestrator.docs", str(tmp_path)], capture_output=True,
                           text=True, timeout=120)
    assert again.stdout.strip() == "every generated section is up to date"


def test_the_methods_table_names_every_method_and_its_defaults():
    table = docs.methods_table()
    for card in registry.method_cards():
        assert f"| `{card.name}` | {card.label} |" in table
        for h in card.hparams:
            assert f"`{h.name}`" in table
    assert "[0.35 on the cross-domain benchmark]" in table


def test_a_log_becomes_its_tables_and_counted_checks(tmp_path):
    log = tmp_path / "benchmarks" / "logs" / "x.txt"
    log.parent.mkdir(parents=True)
    log.write_text("machine: test\n1. exact:\n"
                   "  engine bca config 0   ok  identical True, max dpost 1.5e-06, 0 of 20 samples over 1e-04\n"
                   "  engine bca config 1   ok  identical False, max dpost 3.0e-03, 2 of 20 samples over 1e-04\n"
                   "  done clip\nWARNING:root:noise\n| a | b |\n|---|--:|\n| x | 1 |\nload average at end 1.0\n")
    text = docs.log_summary(log)
    assert "_machine: test_" in text and "**exact**" in text
    assert "2 checks against the CPU reference: NOT all identical" in text and "3.0e-03" in text
    assert "| a | b |\n|---|--:|\n| x | 1 |\n\n- load average at end 1.0" in text
    assert "done clip" not in text and "WARNING" not in text


# ----------------------------------------------------------------------------------------------- commands
def test_every_bash_command_is_run_here_or_by_a_named_test():
    shown = [c for _, text in all_blocks("bash", OWN) for c in commands(text)]
    unknown = [c for c in shown if c not in RUN_HERE and c not in ELSEWHERE]
    assert unknown == [], "commands in the docs that no test runs: add them to RUN_HERE or ELSEWHERE"
    assert set(RUN_HERE) | set(ELSEWHERE) <= set(shown), "commands listed here that the docs no longer show"
    for where in ELSEWHERE.values():
        path, _, test = where.partition("::")
        assert (REPO / path).exists(), where
        assert not test or f"def {test}(" in (REPO / path).read_text(), where


def test_readme_starts_with_the_two_commands_and_is_short():
    text = (REPO / "README.md").read_text()
    lang, first = blocks(REPO / "README.md")[0]
    assert lang == "bash" and commands(first) == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert text.index("```bash") < text.index("\n## ")
    assert len(text.splitlines()) <= 200


def test_demo_script_runs_the_demo_spec():
    """scripts/demo.sh installs, then runs exactly the sweep the `demo` fixture runs."""
    lines = [line for line in (REPO / "scripts" / "demo.sh").read_text().splitlines() if line.strip()]
    assert lines[-1] == 'bca sweep experiments/demo.yaml --resume "$@"'


def test_test_script_runs_pytest():
    lines = [line for line in (REPO / "scripts" / "test.sh").read_text().splitlines() if line.strip()]
    assert lines[-1] == 'python -m pytest "$@"'


@pytest.mark.slow
def test_commands_run_and_print_what_the_docs_show(demo):
    root, _ = demo
    sql = next(text for _, text in all_blocks("sql", OWN))
    (root / "q.sql").write_text(sql)
    shown = {c: (page, out) for page, text, out in block_outputs("bash") for c in commands(text) if out}
    for command in sorted(RUN_HERE):
        done = run(command, root)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if command not in shown:
            continue
        page, expected = shown[command]
        got = [line.replace(str(root / "results"), USER_RESULTS) for line in table_lines(done.stdout)]
        if REFRESH:
            replace_block(page, expected, "\n".join(got) + "\n")
            continue
        missing = [line for line in table_lines(expected) if line not in got]
        assert missing == [], f"{command}: the docs show lines it does not print; it printed:\n{done.stdout}"
    csv = (root / "out.csv").read_text().splitlines()
    assert csv[0] == "method,stream,acc,n,gain" and len(csv) > 1


def _shape(line: str) -> str:
    """A progress line with its numbers blanked: what stays the same from run to run."""
    return re.sub(r"\d[\d,.:]*", "9", line.strip())


@pytest.mark.slow
def test_the_readme_shows_the_demo_as_it_prints(demo):
    """The README's excerpt of the demo's output: its lines are lines the demo prints (progress lines, which carry
    timings, by their shape), and docs/sweeps.md's progress example has the shape of a real one."""
    root, printed = demo
    got = [line.replace(str(root / "results"), USER_RESULTS) for line in table_lines(printed)]
    progress = [line for line in got if re.match(r"^\[\d+/\d+\] ", line)]
    readme = next(text for lang, text in blocks(REPO / "README.md") if lang == "" and " runs finished, " in text)
    example = next(text for lang, text in blocks(REPO / "docs" / "sweeps.md") if lang == "" and "ETA" in text)
    if REFRESH:
        rows = [line for line in got if line.startswith("│")]
        chosen = [line for line in rows if "iid" in line] or rows[:6]
        table = next(i for i, line in enumerate(got) if line.startswith("┃"))
        excerpt = [*got[:got.index(progress[0])], *progress[:2], "...", progress[-1], "", got[table - 1], got[table],
                   *chosen, "...",
                   next(line for line in got if " runs finished, " in line)]
        replace_block(REPO / "README.md", readme, "\n".join(excerpt) + "\n")
        replace_block(REPO / "docs" / "sweeps.md", example, progress[len(progress) // 8] + "\n")
        return
    shapes = {_shape(line) for line in progress}
    missing = [line for line in table_lines(readme) if line != "..."
               and (_shape(line) not in shapes if re.match(r"^\[\d+/\d+\] ", line) else line not in got)]
    assert missing == [], f"the README shows lines the demo does not print; it printed:\n{printed[-4000:]}"
    assert _shape(example) in shapes, f"docs/sweeps.md's progress example is not shaped like {progress[0]!r}"


def test_python_blocks_run_and_print_what_the_docs_show(tmp_path):
    found = block_outputs("python")
    assert found
    for page, code, expected in found:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{page.name}:\n{code}\n{done.stderr[-3000:]}"
        if expected is not None and REFRESH:
            replace_block(page, expected, done.stdout)
        elif expected is not None:
            assert done.stdout == expected, f"{page.name}: printed {done.stdout!r}, the docs show {expected!r}"


def test_inline_bca_commands_use_real_options():
    import typer

    from orchestrator.cli import app

    group = typer.main.get_command(app)
    bad = []
    for page in PAGES:
        for command in re.findall(r"`(bca [^`]+)`", page.read_text()):
            words = command.split()
            sub = group.commands.get(words[1])
            if sub is None:
                bad.append(f"{page.name}: {command}")
                continue
            opts = {o for p in sub.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]} | {"--help"}
            bad += [f"{page.name}: {command} ({w})" for w in words[2:] if w.startswith("-") and w not in opts]
    assert bad == []


# ---------------------------------------------------------------------------------------------------- SQL
def _sql_checks(frames, scratch: Path):
    samples, runs = frames
    stream = runs.set_index("run_id")["stream"]

    def ranking(rows):
        """Each row is one configuration (its runs over the orders): its mean and its gain over CLIP."""
        assert rows and all(r["n"] == 3 for r in rows)
        mine = runs[runs.dataset == "synthetic-imagenet_like"]
        means = mine.groupby("group_id").agg(method=("method", "first"), stream=("stream", "first"),
                                             mean=("accuracy", "mean"))
        clip = means[means.method == registry.baseline_method()].set_index("stream")["mean"]
        want = sorted((g.method, g.stream, g.mean, g.mean - clip[g.stream]) for g in means.itertuples())
        got = sorted((r["method"], r["stream"], r["acc"], r["gain"]) for r in rows)
        assert [w[:2] for w in want] == [g[:2] for g in got]
        for w, g in zip(want, got):
            assert g[2] == pytest.approx(w[2], abs=0.006) and g[3] == pytest.approx(w[3], abs=0.011)
        assert [r["acc"] for r in rows] == sorted((r["acc"] for r in rows), reverse=True)

    def windowed(rows):
        """In-distribution rows only, each stream protocol and each BCA setting (n1) apart."""
        n1 = runs.set_index("run_id")["n1"]
        bca = samples[samples.method == "bca"].assign(stream=lambda d: d.run_id.map(stream),
                                                      n1=lambda d: d.run_id.map(n1),
                                                      win=lambda d: d.sample_idx // 500)
        assert bca.is_ood.any(), "the demo has contaminated streams: the claim about OOD rows is tested on them"
        inside = bca[~bca.is_ood]
        want = inside.groupby(["dataset", "stream", "n1", "win"]).agg(acc=("correct", "mean"),
                                                                      n=("correct", "size"))
        assert len(rows) == len(want)
        for r in rows:
            w = want.loc[(r["dataset"], r["stream"], r["n1"], r["win"])]
            assert r["samples"] == w.n and r["accuracy"] == pytest.approx(round(100 * w.acc, 2), abs=0.006)
        assert sum(r["samples"] for r in rows) == len(inside) < len(bca)
        assert len({r["stream"] for r in rows}) == runs.stream.nunique()

    def paired(rows):
        key = ["dataset", "stream", "seed", "order_index"]
        clip = runs[runs.method == "clip"].set_index(key)["run_id"]
        by_run = {rid: df.sort_values("sample_idx") for rid, df in samples.groupby("run_id")}
        want: dict[tuple, list[int]] = {}
        for r in runs[runs.method != "clip"].itertuples():
            a = by_run[r.run_id]
            b = by_run[clip[(r.dataset, r.stream, r.seed, r.order_index)]]
            keep = ~a.is_ood.to_numpy()
            ca, cb = a.correct.to_numpy()[keep], b.correct.to_numpy()[keep]
            cell = want.setdefault((r.dataset, r.method, r.stream), [0, 0])
            cell[0] += int(np.sum(ca & ~cb))
            cell[1] += int(np.sum(cb & ~ca))
        assert {(r["dataset"], r["method"], r["stream"]): [r["helped"], r["hurt"]] for r in rows} == want

    def unfinished(rows):
        assert rows == []  # the demo finished; a results dir with unfinished runs:
        from orchestrator.results.testing import write_fake_run

        other = scratch / "unfinished_results"
        base = {"sweep": "s", "backbone": "b", "dataset": "d", "seed": 1}
        write_fake_run(other, {**base, "method": "clip"}, n=50)
        running = write_fake_run(other, {**base, "method": "bca"}, n=50, rows=20, status="running")
        return other, [running.run_id]

    return {"ranking": ranking, "windowed accuracy": windowed, "helped and hurt against CLIP": paired,
            "unfinished runs": unfinished}


@pytest.mark.slow
def test_every_sql_example_runs_and_holds_what_it_claims(demo, frames, tmp_path):
    """The SQL examples of these pages each have a check of what their text says; those of the pages other
    branches write (PARALLEL, checked by their own tests) must at least run, statement by statement."""
    results = demo[0] / "results"
    checks = _sql_checks(frames, tmp_path)
    seen = set()
    for page, sql in all_blocks("sql"):
        if page.name in PARALLEL:
            for statement in statements(sql):
                query(statement, results)
            continue
        title = re.match(r"-- ([^:\n]+)", sql)
        assert title and title.group(1) in checks, f"{page.name}: an SQL example no check knows:\n{sql}"
        seen.add(title.group(1))
        again = checks[title.group(1)](query(sql, results))
        if again:  # the check asks for the same query over other results
            other, want = again
            assert [r["run_id"] for r in query(sql, other)] == want
    assert seen == set(checks)


def statements(sql: str) -> list[str]:
    """The statements of a block: split at semicolons and at lines that start a new SELECT or WITH."""
    parts = re.split(r";\s*\n|\n(?=(?:SELECT|WITH)\b)", sql)
    return [part.strip().rstrip(";") for part in parts if part.strip() and not part.strip().startswith("--")]


# ------------------------------------------------------------------------------------------ specs and views
def test_yaml_spec_examples_validate(tmp_path):
    from orchestrator.sweep.spec import current_spec_model

    specs = [(page, yaml.safe_load(text)) for page, text in all_blocks("yaml", OWN)]
    assert specs
    for page, spec in specs:
        current_spec_model().model_validate(spec)
        if all("synthetic" in d for d in spec["datasets"]) and not spec.get("backbones"):
            path = tmp_path / "experiments" / f"{spec['name']}.yaml"
            path.parent.mkdir(exist_ok=True)
            path.write_text(yaml.safe_dump(spec))
            done = subprocess.run([bca_executable(), "sweep", str(path), "--dry-run"], capture_output=True,
                                  text=True, timeout=300, env=WIDE)
            assert done.returncode == 0 and "dry run" in done.stdout, done.stdout + done.stderr


def test_the_spec_reference_names_every_key():
    from orchestrator.data.synthetic import SYNTHETIC_KINDS, synthetic_defaults
    from orchestrator.sweep.spec import Backbone, RealDataset, Resources, SweepSpec, SyntheticDataset

    text = (REPO / "docs" / "reference-spec.md").read_text()
    keys = {*SweepSpec.model_fields, *Backbone.model_fields, *RealDataset.model_fields, *Resources.model_fields,
            "synthetic", "datasets", "method", *(p for k in SYNTHETIC_KINDS for p in synthetic_defaults(k))}
    assert SyntheticDataset.model_fields.keys() >= {"synthetic", "name"}
    assert sorted(k for k in keys if f"`{k}`" not in text) == []
    top = re.findall(r"^\| `(\w+)` \|", text.split("## Top-level keys", 1)[1].split("\n## ", 1)[0], re.M)
    assert set(top) == set(SweepSpec.model_fields)


def test_the_results_reference_names_every_column_of_the_views(tmp_path):
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.schema import hparam_columns

    text = (REPO / "docs" / "reference-results.md").read_text()
    statistics = REPO / "docs" / "statistics.md"  # the statistics' columns are defined there
    defined = set(re.findall(r"`(\w+)`", statistics.read_text())) if statistics.is_file() else set()
    hparams = {c.name for c in hparam_columns()}
    db = ResultsDB(tmp_path)
    for view in ("accuracy", "summary", "paired"):
        section = text.split(f"### `{view}`", 1)[1].split("\n#", 1)[0]
        documented = set(re.findall(r"`(\w+)`", section))
        columns = set(db.df(f"DESCRIBE {view}")["column_name"]) - hparams
        assert sorted(columns - documented - defined) == [], f"columns of {view} the reference does not name"
        assert sorted(documented - columns) == [], f"columns the reference names that {view} lacks"


# ------------------------------------------------------------------------------------------ links and scope
def test_relative_links_resolve():
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if re.match(r"\w+://", target):
                continue
            path = (page.parent / target).resolve()
            if not path.exists() and Path(target).name not in PARALLEL:
                missing.append(f"{page.relative_to(REPO)} -> {target}")
    assert missing == []


def test_nothing_points_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"\.\./shared|REFERENCE\.md|methods-spec")
    found = [f"{name}:{i}" for name in files if (REPO / name).is_file() and not name.endswith(".png")
             for i, line in enumerate((REPO / name).read_text(errors="ignore").splitlines(), 1)
             if pattern.search(line) and name != "tests/test_docs.py"]
    assert found == []
