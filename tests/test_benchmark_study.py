"""`python -m benchmarks.study`: the study's projection from measured slices (quick mode on the CPU)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from benchmarks import study


def _unit(seconds: float, groups: int) -> study.Unit:
    return study.Unit("dtd", "RN50", "bca", samples=int(seconds * 10), views=1, rate=10.0, peak_bytes=0,
                      gemm_fraction=0.0, groups=groups)


def test_makespan_splits_units_into_passes_of_g_orders():
    # 100 orders in passes of 50: two passes of 50 s each; one device runs both, two devices one each.
    units = [_unit(100.0, 50)]
    assert study.makespan(units, 1, 100) == pytest.approx(100.0)
    assert study.makespan(units, 2, 100) == pytest.approx(50.0)
    # A pass cannot be split: 64 devices still take one pass's time.
    assert study.makespan(units, 64, 100) == pytest.approx(50.0)
    # Longest first onto the least loaded device: passes 60, 40, 30, 30 on two devices -> 60 + 30, 40 + 30.
    units = [_unit(60.0, 100), _unit(40.0, 100), _unit(60.0, 50)]
    assert study.makespan(units, 2, 100) == pytest.approx(90.0)


def test_an_order_free_unit_is_computed_once_for_all_orders_as_the_sweep_replays_it():
    free = study.Unit("dtd", "RN50", "zero", samples=100 * 1692, views=64, rate=1692.0, peak_bytes=0,
                      gemm_fraction=0.0, groups=10, order_free=True, setup_s=0.5, passes=10)
    swept = study.as_swept([free, _unit(100.0, 50)], 100)
    assert swept[0].samples == 1692 and swept[0].passes == 1 and swept[0].seconds == pytest.approx(1.5)
    assert swept[1] == _unit(100.0, 50)  # an order-dependent method runs every order
    assert study.makespan(swept[:1], 1, 100) == pytest.approx(1.5)


def test_quick_study_prints_every_method_and_a_consistent_total(capsys):
    study.main(["--quick", "--methods", "clip", "bca", "tda", "dota", "--backbones", "RN50"])
    out = capsys.readouterr().out
    rows = {m.group(1).strip(): float(m.group(2).replace(",", ""))
            for m in re.finditer(r"^\| (\S[^|]*?)\s*\|\s*([\d,]+) \|", out, re.M)}
    assert set(rows) == {"CLIP", "BCA", "TDA", "DOTA", "total"}
    assert rows["total"] == pytest.approx(sum(v for k, v in rows.items() if k != "total"), abs=4)
    seconds = [float(s) for s in re.findall(r"projected on +\d+ device\(s\): [\d.]+ h \(([\d.e+-]+) s\)", out)]
    assert len(seconds) == 3 and seconds[0] >= seconds[1] >= seconds[2] > 0
    # 2 quick datasets (ImageNet-A 7,500 and DTD 1,692 test images) x 100 orders x 4 methods.
    assert f"{(7500 + 1692) * 100 * 4:,} method-samples" in out


def test_quick_study_measures_every_registered_method():
    """Every card runs in the study (batch methods at their official size, prompt tuning through a text tower), each
    once per unit; the methods without a lockstep runner and prompt tuning measure one stream per pass."""
    from orchestrator.registry import method_cards, method_label
    from orchestrator.registry.backbones import names_teacher

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        study.main(["--quick", "--datasets", "dtd", "--backbones", "ViT-B-16"])
    text = out.getvalue()
    table = {m.group(1).strip(): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| (\S[^|]*?)\s*\|[^|]*\|[^|]*\|\s*(\d*)\s*\|\s*(\S*)\s*\|", text, re.M)}
    from orchestrator.methods.episodic import order_free

    for card in method_cards():
        # runs on images, or reads a second encoder's (or a CLIP teacher's) features
        if card.image_encoder is not None or card.auxiliary or names_teacher(card):
            assert method_label(card.name) not in table, card.name
            continue
        assert method_label(card.name) in table, card.name
        alone = card.text_encoder is not None or card.lockstep_runner(card.takes_views) is None
        groups, together = table[method_label(card.name)]
        assert (groups == "1") == alone, card.name
        # whether a pass steps orders together, grid points of one order, or one stream; order-free: once
        assert together in (("once",) if order_free(card.name) else ("-",) if alone else ("G", "one")), card.name
    assert "without prompt tuning" in text and "every order computed (order-free runs not replayed)" in text


def test_time_limit_reports_the_units_left_out(capsys):
    study.main(["--quick", "--datasets", "dtd", "--backbones", "RN50", "--methods", "clip", "bca", "--time-limit", "0"])
    out = capsys.readouterr().out
    assert "measured 0 units" in out and "| total" not in out
    assert "NOT measured (--time-limit 0 s reached), so not in the totals: 2 units, of dtd; first left: dtd RN50 clip" in out
