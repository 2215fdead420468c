"""docs/adding-a-method.md as a newcomer follows it: its files written as the page shows them, its commands run as
written. The plugin (card, method, lockstep runner, in a folder outside the project) goes through a packed sweep,
`bca report` and the dashboard; its lockstep runner is the one a pack uses, and equals the single-stream method.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding-a-method.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def doc_files() -> dict[str, str]:
    """path -> text of every python / yaml block whose first line is a comment naming its file."""
    out = {}
    for lang, body in BLOCK.findall(DOC.read_text()):
        first = body.split("\n", 1)[0]
        if lang in ("python", "yaml") and re.fullmatch(r"# [\w/]+\.(py|yaml)", first):
            out[first[2:]] = body.split("\n", 1)[1] if "\n" in body else ""
    return out


def doc_commands() -> list[str]:
    return [line[2:] for lang, body in BLOCK.findall(DOC.read_text()) if lang == "console"
            for line in body.splitlines() if line.startswith("$ ")]


def write_plugin(root: Path) -> None:
    for path, text in doc_files().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def test_the_doc_shows_a_whole_plugin():
    assert set(doc_files()) == {"toy_temp/__init__.py", "toy_temp/card.py", "toy_temp/method.py",
                                "toy_temp/lockstep.py", "toy.yaml", "toy_entropy/card.py", "toy_entropy/method.py"}
    assert doc_commands()[1:] == ["bca sweep toy.yaml", "BCA_PLUGINS=toy_temp bca report --results results"]


@pytest.fixture(scope="module")
def plugin_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The doc's files in a fresh folder and its commands run there, as one shell session."""
    root = tmp_path_factory.mktemp("newcomer")
    write_plugin(root)
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("BCA_PLUGINS", None)
    script = "set -e\n" + "\n".join(doc_commands())
    done = subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root, done.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_docs_commands_run_the_plugin_through_a_packed_sweep_and_the_report(plugin_sweep):
    root, out = plugin_sweep
    assert out.count("Tempered CLIP (temp_scale=10)") >= 2  # the end-of-sweep table and the report
    assert out.count("Tempered CLIP (temp_scale=100)") >= 2
    code = ("import json, sys\n"
            "from orchestrator.results.db import ResultsDB\n"
            "db = ResultsDB(sys.argv[1])\n"
            "rows = db.sql('SELECT method, temp_scale, accuracy FROM runs ORDER BY method, temp_scale').to_pylist()\n"
            "print(json.dumps(rows))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]), "BCA_PLUGINS": "toy_temp"}
    read = subprocess.run([sys.executable, "-c", code, str(root / "results")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert read.returncode == 0, read.stderr
    import json

    rows = {(r["method"], r["temp_scale"]): r["accuracy"] for r in json.loads(read.stdout)}
    assert set(rows) == {("clip", None), ("temp", 10.0), ("temp", 100.0)}
    assert rows[("temp", 100.0)] == rows[("clip", None)]  # CLIP's own logit scale: the same predictions


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dashboard_shows_the_plugin_method(plugin_sweep, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    root, _ = plugin_sweep
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("BCA_PLUGINS", "toy_temp")
    monkeypatch.setenv(RESULTS_ENV, str(root / "results"))
    at = AppTest.from_file(str(APP_PATH), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.table[0].value
    shown = " ".join(str(v) for v in table.reset_index().astype(str).values.ravel())
    assert "Tempered CLIP (temp_scale=10)" in shown and "Tempered CLIP (temp_scale=100)" in shown


def test_a_pack_sends_the_plugin_configs_to_its_lockstep_runner(tmp_path, monkeypatch):
    """In process: run_traces_many hands both temp configs to the card's runner in one call, and its traces
    equal the single-stream runs."""
    import torch

    write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from orchestrator import registry
    from orchestrator.methods import make_method, run_traces_many

    registry.load_plugins(["toy_temp"])
    import toy_temp.lockstep

    calls = []
    real = toy_temp.lockstep.run_tempered_lockstep
    monkeypatch.setattr(toy_temp.lockstep, "run_tempered_lockstep",
                        lambda methods, features: calls.append([m.name for m in methods]) or real(methods, features))
    gen = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(6, 8, generator=gen), dim=1)
    feats = torch.nn.functional.normalize(torch.randn(40, 8, generator=gen), dim=1)
    ids = torch.arange(6)
    configs = [{"method": "temp", "temp_scale": 10.0}, {"method": "clip"}, {"method": "temp"}]
    traces = run_traces_many(feats, emb, ids, 6, configs)
    assert calls == [["temp", "temp"]]
    for config, trace in zip(configs, traces):
        single = make_method(config["method"], emb, ids, 6, **{k: v for k, v in config.items() if k != "method"})
        expected = single.run(feats)
        assert torch.equal(trace.predictions, expected.predictions)
        torch.testing.assert_close(trace.posteriors, expected.posteriors, rtol=0, atol=1e-6)


def test_the_image_encoder_plugin_runs_through_a_sweep_the_report_and_the_dashboard(tmp_path, monkeypatch):
    """Section 6's plugin (its two files as the page shows them) in a sweep beside zero-shot CLIP on a real-layout
    image dataset with the tiny model, run trial by trial, its row in `bca report` and in the dashboard's table."""
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config
    from orchestrator.registry.methods import PLUGINS_ENV
    from orchestrator.sweep.load import load_spec
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.trial import execute_trial

    for path, text in doc_files().items():
        if path.startswith("toy_entropy/"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=2)
    (tmp_path / "enc.yaml").write_text(yaml.safe_dump({
        "name": "enc", "results_dir": "results", "cache_dir": "cache", "data_root": "data", "plugins": ["toy_entropy"],
        "backbones": [{"model": TINY_VIT, "pretrained": "random",
                       "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
        "datasets": ["dtd"], "methods": [{"method": "clip"}, {"method": "entropy_sgd", "batch_size": "official"}],
        "seeds": [1], "resources": {"cpus": 1}}))
    spec = load_spec(tmp_path / "enc.yaml")
    for trial in make_trials(expand(spec), spec.pack):
        execute_trial(trial, settings_of(spec))
    monkeypatch.setenv(PLUGINS_ENV, "toy_entropy")
    r = CliRunner().invoke(app, ["report", "--results", "results"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    assert "Entropy SGD (batch_size=16)" in r.stdout and "CLIP (batch_size=1)" in r.stdout

    from streamlit.testing.v1 import AppTest

    from dashboard import APP_PATH, RESULTS_ENV

    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results"))
    at = AppTest.from_file(str(APP_PATH), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(str(v) for v in at.table[0].value.reset_index().astype(str).values.ravel())
    assert "Entropy SGD (batch_size=16)" in shown and "CLIP (batch_size=1)" in shown

BUILT_IN = '''
import json
import orchestrator
from typer.testing import CliRunner
from orchestrator import docs, registry
from orchestrator.cli import app
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.trial import execute_trial

wide = {"COLUMNS": "200", "NO_COLOR": "1"}
plan = CliRunner().invoke(app, ["sweep", "toy.yaml", "--dry-run"], env=wide)
spec = load_spec("toy.yaml")
for trial in make_trials(expand(spec), spec.pack):
    execute_trial(trial, settings_of(spec))
report = CliRunner().invoke(app, ["report", "--results", "results"], env=wide)
print(json.dumps({
    "package": orchestrator.__file__, "impl": registry.method_card("temp").impl,
    "builtin": [c.name for c in registry.method_cards() if c.impl.startswith("orchestrator.methods.")],
    "plan": [plan.exit_code, plan.stdout], "report": [report.exit_code, report.stdout],
    "tables": docs.methods_table() + docs.protocols_table(),
}))
'''


def test_a_built_in_method_is_one_folder(tmp_path):
    """Section 5 in a copy of the package: the page's plugin moved to orchestrator/methods/temp/, its module paths
    written as the page says, no other file edited. The registry finds it among the built-in methods, a sweep plans
    and runs it (trial by trial, without Ray), the report labels it, the generated methods and protocols tables list
    it, and the one hand-written row it still needs (its official loader's views, a test's table) is named."""
    import json
    import shutil

    import yaml

    from tests.official_protocols import missing_rows

    package = tmp_path / "copy" / "orchestrator"
    shutil.copytree(REPO / "orchestrator", package, ignore=shutil.ignore_patterns("__pycache__"))
    files = doc_files()
    for path, text in files.items():
        if path.startswith("toy_temp/"):
            (package / "methods" / "temp" / Path(path).name).parent.mkdir(parents=True, exist_ok=True)
            (package / "methods" / "temp" / Path(path).name).write_text(text.replace("toy_temp.",
                                                                                     "orchestrator.methods.temp."))
    spec = yaml.safe_load(files["toy.yaml"])
    del spec["plugins"]  # a built-in method needs none
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    env.pop("BCA_PLUGINS", None)
    done = subprocess.run([sys.executable, "-c", BUILT_IN], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["package"] == str(package / "__init__.py")  # the copy, not the checkout
    assert out["impl"] == "orchestrator.methods.temp.method:Tempered" and "temp" in out["builtin"]
    assert out["plan"][0] == 0 and re.search(r"\btemp\b", out["plan"][1]), out["plan"][1]
    assert out["report"][0] == 0, out["report"][1]
    assert "Tempered CLIP (temp_scale=10)" in out["report"][1] and "Tempered CLIP (temp_scale=100)" in out["report"][1]
    assert "| `temp` | Tempered CLIP |" in out["tables"] and "| `temp` | `single` |" in out["tables"]
    assert [line.partition(":")[0] for line in missing_rows(out["builtin"])] == ["temp"]
