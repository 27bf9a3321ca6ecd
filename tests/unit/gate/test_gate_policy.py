"""gates.yaml tenants: the repository's file loads; every mistake names file:line and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.runtime.errors import ConfigFileError

pytestmark = pytest.mark.unit

SUPPORT = """\
  support:
    description: support
    floors:
      - {suite: support-domain, metric: flips_lost, max: 2}
"""


def write(tmp_path: Path, tenants: str, support: str = SUPPORT) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text("version: 1\nmodel_classes: {}\ntenants:\n" + support + tenants)
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_repository_gates_load(repo_root, catalog):
    gates = load_gates(repo_root / "gates.yaml", catalog)
    assert {"chat", "reasoning", "batch", "support"} <= set(gates.tenants)
    assert gates.tenants["batch"].floors[0].kind == "max_delta_pct"
    draft_only = [f for t in gates.tenants.values() for f in t.floors if f.metric == "acceptance_k4"]
    assert draft_only and all(f.applies_to == ["draft-int4"] or f.applies_to is None for f in draft_only)
    # the build classifies through the same model
    assert gates.classify(moe=False, params=135_000_000, context=8192) == "draft"


@pytest.mark.parametrize(
    ("floor", "needle", "expected"),
    [
        (
            "{suite: wikitext, metric: kld_mean, maxx: 0.05}",
            "maxx",
            "unknown key 'maxx' (did you mean 'max'?)",
        ),
        (
            "{suite: wikitxt, metric: kld_mean, max: 0.05}",
            "wikitxt",
            "unknown suite 'wikitxt' (did you mean 'wikitext'?)",
        ),
        ("{suite: wikitext, metric: kld_maen, max: 0.05}", "kld_maen", "(did you mean 'kld_mean'?)"),
        ("{suite: gsm8k, metric: perplexity, max: 1}", "perplexity", "unknown metric for suite 'gsm8k'"),
        (
            "{suite: long-chain, metric: acceptance_k4, min: 3, applies_to: [draft-int5]}",
            "draft-int5",
            "unknown target 'draft-int5' (did you mean 'draft-int4'?)",
        ),
        (
            "{suite: wikitext, metric: top1_agreement, max: 0.9}",
            "top1_agreement",
            "higher-is-better: use min or min_recovery",
        ),
        ("{suite: wikitext, metric: kld_mean, min_recovery: 0.9}", "min_recovery: 0.9", "lower-is-better"),
        ("{suite: wikitext, metric: kld_mean, max: 0.05, min: 0.01}", "min: 0.01", "exactly one of"),
        (
            "{suite: gsm8k, metric: flip_rate, max_delta_pct: 5}",
            "flip_rate",
            "already compares with the source: use max",
        ),
        (
            "{suite: wikitext, metric: kld_mean, max_regression: -0.01}",
            "max_regression",
            "greater than or equal to 0",
        ),
        (
            "{suite: wikitext, metric: kld_mean, max: 0.05, max_regression: 0.01}",
            "max_regression",
            "exactly one of",
        ),
        ("{suite: wikitext, metric: kld_mean, max: 0.05, advisory: sometimes}", "advisory", "valid boolean"),
    ],
)
def test_floor_mistakes_name_the_line_and_nearest_name(tmp_path, floor, needle, expected):
    path = write(
        tmp_path,
        f"  chat:\n    description: chat\n    floors:\n      - {{suite: traffic, metric: kld_mean, max: 0.05}}\n      - {floor}\n",
    )
    with pytest.raises(ConfigFileError) as err:
        load_gates(path, Catalog(Path(__file__).parents[3]))
    message = str(err.value)
    assert f"{path}:{line_of(path, needle)}:" in message
    assert expected in message


def test_repository_floors_bound_lost_answers_and_mark_what_a_small_model_cannot_inform(repo_root, catalog):
    gates = load_gates(repo_root / "gates.yaml", catalog)
    floors = [(name, f) for name, t in gates.tenants.items() for f in t.floors]
    # a gained answer is no regression: no floor bounds flips in both directions
    assert not [f for _, f in floors if f.metric == "flip_rate"]
    # GSM8K and HumanEval cannot inform the 135M default: advisory, so they never decide its verdicts
    assert all(f.advisory for _, f in floors if f.suite in ("gsm8k", "humaneval"))
    # a floor at the no-change point can never be decided: none is written
    assert not [f for _, f in floors if f.kind == "max" and f.value == 0]
    regression = [f for _, f in floors if f.kind == "max_regression"]
    assert regression and all(f.advisory for f in regression)


def test_unknown_tenant_key_and_tenant_level_target(tmp_path, catalog):
    path = write(
        tmp_path,
        "  chat:\n    descripton: chat\n    floors:\n      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
    )
    with pytest.raises(
        ConfigFileError, match=r"unknown key 'descripton' \(did you mean 'description'\?\)"
    ) as err:
        load_gates(path, catalog)
    assert f":{line_of(path, 'descripton')}:" in str(err.value)
    path = write(
        tmp_path,
        "  spec:\n    description: d\n    applies_to: [hoper-fp8]\n    floors:\n"
        "      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
    )
    with pytest.raises(
        ConfigFileError, match=r"unknown target 'hoper-fp8' \(did you mean 'hopper-fp8'\?\)"
    ) as err:
        load_gates(path, catalog)
    assert f":{line_of(path, 'hoper-fp8')}:" in str(err.value)


def test_domain_suite_names_an_unknown_tenant(tmp_path, catalog):
    # eval_suites/support-domain.yaml belongs to tenant 'support'; a file that renamed it is wrong
    path = write(tmp_path, "", support=SUPPORT.replace("  support:", "  suport:"))
    with pytest.raises(ConfigFileError) as err:
        load_gates(path, catalog)
    assert "belongs to tenant 'support'" in str(err.value) and str(path) in str(err.value)
    path = write(
        tmp_path,
        "  suport:\n    description: d\n    floors:\n      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
        support="  other:\n    description: d\n    floors:\n      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
    )
    with pytest.raises(
        ConfigFileError,
        match=r"unknown tenant \(named by eval_suites/support-domain.yaml\) 'support' \(did you mean 'suport'\?\)",
    ):
        load_gates(path, catalog)


@pytest.mark.parametrize(
    "spread, expected",
    [
        (
            "{max: {wikitext.kld_maen: 0.001}}",
            "unknown metric of suite 'wikitext' 'kld_maen' (did you mean 'kld_mean'?)",
        ),
        ("{max: {wikitxt.kld_mean: 0.001}}", "unknown suite 'wikitxt' (did you mean 'wikitext'?)"),
        ("{maximum: {wikitext.kld_mean: 0.001}}", "unknown profile or floor kind 'maximum'"),
        ("{max: {wikitext.kld_mean: -0.001}}", "greater than or equal to 0"),
    ],
)
def test_numerics_spread_names_its_mistakes(tmp_path, catalog, spread, expected):
    path = write(
        tmp_path,
        "  chat:\n    description: chat\n    floors:\n      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
    )
    path.write_text(path.read_text() + f"numerics_spread: {spread}\n")
    with pytest.raises(ConfigFileError) as err:
        load_gates(path, catalog)
    assert expected in str(err.value) and f"{path}:" in str(err.value)


def test_numerics_spread_is_kept_per_profile(tmp_path, catalog):
    # a smoke window (512 tokens) moves more between a GPU and a CPU than a full one (2,048): the
    # H200's smoke spreads were several times the full ones, so a full-profile verdict must not be
    # marked marginal by a smoke figure, nor a smoke verdict escape by a full one
    path = write(
        tmp_path,
        "  chat:\n    description: chat\n    floors:\n      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
    )
    path.write_text(
        path.read_text()
        + "numerics_spread:\n  smoke: {max: {traffic.kld_mean: 0.002}}\n  full: {max: {traffic.kld_mean: 0.0005}}\n"
        + "  any: {max: {traffic.kld_mean: 0.001}}\n"
    )
    gates = load_gates(path, catalog)
    (floor,) = gates.tenants["chat"].floors
    assert gates.spread(floor, "smoke") == 0.002
    assert gates.spread(floor, "full") == 0.001  # 'any' holds at every profile: the larger counts
    assert gates.spread(floor, None) == 0.002  # an evaluation of unknown profile: the largest

    flat = write(
        tmp_path,
        "  chat:\n    description: chat\n    floors:\n      - {suite: traffic, metric: kld_mean, max: 0.05}\n",
    )
    flat.write_text(flat.read_text() + "numerics_spread: {max: {traffic.kld_mean: 0.001}}\n")
    (floor,) = load_gates(flat, catalog).tenants["chat"].floors
    assert load_gates(flat, catalog).spread(floor, "smoke") == 0.001  # kinds alone: every profile

    flat.write_text(
        flat.read_text().replace("numerics_spread: {max:", "numerics_spread: {smok: {max:") + "}\n"
    )
    flat.write_text(flat.read_text().replace("0.001}}\n}\n", "0.001}}}\n"))
    with pytest.raises(ConfigFileError) as err:
        load_gates(flat, catalog)
    assert "unknown profile or floor kind 'smok' (did you mean 'smoke'?)" in str(err.value)
