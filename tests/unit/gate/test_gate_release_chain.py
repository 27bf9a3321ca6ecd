"""Regression floors against what is served, release after release (issue 24).

A ``max_regression`` floor once compared this evaluation with the approved version's *floor estimate*,
which for a regression floor is that version's own change against its predecessor (about 0): the
third release of an unchanged evaluation then failed chat, and a higher-is-better regression floor
let any damage pass from the third release on. Now the comparison is paired with the approved
version's per-item records (published beside its report), or, without them, with its metric's value,
never with a delta. Gated against a chain of its own releases, one evaluation gets the same verdicts at
every link, and a damaged copy fails against every link, for metrics of either direction.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from gate_builders import edit

from quantgate.gate.run import gate_results, write_report_json

pytestmark = pytest.mark.unit

# a tenant with regression floors in both directions, on suites the FP8 artifacts of e1 pass
CHAIN = """
  served:
    description: held to what it is served today, both ways
    floors:
      - {suite: traffic, metric: kld_mean, max: 0.5}
      - {suite: traffic, metric: kld_mean, max_regression: 0.01}
      - {suite: wikitext, metric: top1_agreement, max_regression: 0.01}
"""


@pytest.fixture
def policy(repo_root, tmp_path) -> Path:
    path = tmp_path / "gates.yaml"
    path.write_text((repo_root / "gates.yaml").read_text() + CHAIN)
    return path


def _gate(results: Path, policy: Path, root: Path, previous: Path | None):
    return gate_results(results, policy, root, model_class="draft", tenants=["served"], previous=previous)


def _statuses(report) -> dict[tuple[str, str], tuple[str, list[str]]]:
    return {
        (v.artifact, v.tenant): (v.verdict, [f"{f.metric} {f.kind_of_floor} {f.status}" for f in v.floors])
        for v in report.verdicts
    }


def _chain(results: Path, policy: Path, root: Path, out: Path, links: int) -> list[Path]:
    """``links`` releases of one evaluation, each gated against the one before and written with its records."""
    dirs, previous = [], None
    for i in range(links):
        report = _gate(results, policy, root, previous)
        previous = out / f"R{i + 1}"
        write_report_json(report, previous, results)
        dirs.append(previous)
    return dirs


def _damaged(e1: Path, tmp_path: Path) -> Path:
    """e1 with hopper-fp8 worse on every window: KL up by 0.05, top-1 agreement down by 0.10."""
    bad = Path(shutil.copytree(e1, tmp_path / "bad"))

    def kl(r):
        for s in r["samples"]:
            s["kld_mean"] += 0.05

    def agree(r):
        for s in r["samples"]:
            s["top1_agreement"] -= 0.10

    edit(bad / "hopper-fp8" / "traffic.json", kl)
    edit(bad / "hopper-fp8" / "wikitext.json", agree)
    return bad


def test_a_chain_of_four_releases_of_one_evaluation_gives_the_same_verdicts(e1, repo_root, policy, tmp_path):
    links = _chain(e1, policy, repo_root, tmp_path, 4)
    again = [_statuses(_gate(e1, policy, repo_root, previous)) for previous in links]
    assert again[0] == again[1] == again[2] == again[3]
    served = again[0][("hopper-fp8", "served")]
    assert served == (
        "pass",
        ["kld_mean max pass", "kld_mean max_regression pass", "top1_agreement max_regression pass"],
    )
    # every link compares the same items with themselves: a paired change of exactly 0
    report = _gate(e1, policy, repo_root, links[3])
    regressions = [f for v in report.verdicts if v.artifact == "hopper-fp8" for f in v.floors[1:]]
    assert all(f.estimate == 0.0 and "paired" in f.paired_with for f in regressions)


def test_a_damaged_artifact_fails_against_every_link_in_both_directions(e1, repo_root, policy, tmp_path):
    links = _chain(e1, policy, repo_root, tmp_path, 4)
    bad = _damaged(e1, tmp_path)
    for previous in links:
        verdict = next(
            v for v in _gate(bad, policy, repo_root, previous).verdicts if v.artifact == "hopper-fp8"
        )
        kl, agreement = verdict.floors[1], verdict.floors[2]
        assert verdict.verdict == "fail"
        assert kl.status == "fail" and kl.estimate == pytest.approx(0.05)  # lower is better: KL rose
        assert agreement.status == "fail" and agreement.estimate == pytest.approx(0.10)  # higher is better


def test_a_version_published_without_records_is_compared_with_its_value_never_its_delta(
    e1, repo_root, policy, tmp_path
):
    links = _chain(e1, policy, repo_root, tmp_path, 3)
    for link in links:  # versions published before records existed
        shutil.rmtree(link / "records")
    third = _gate(e1, policy, repo_root, links[2])
    served = next(v for v in third.verdicts if v.artifact == "hopper-fp8")
    kl = served.floors[1]
    # the approved version's kld_mean (0.0314), not its floor's estimate (its own change, 0): no change
    assert kl.status == "pass" and abs(kl.estimate) < 1e-6 and kl.before == pytest.approx(0.0314, abs=1e-4)
    assert "against" in kl.paired_with and "paired" not in kl.paired_with
    bad = _damaged(e1, tmp_path)
    failed = next(v for v in _gate(bad, policy, repo_root, links[2]).verdicts if v.artifact == "hopper-fp8")
    assert [f.status for f in failed.floors[1:]] == ["fail", "fail"]


def test_records_that_are_not_what_the_report_names_are_not_used(e1, repo_root, policy, tmp_path):
    (link,) = _chain(e1, policy, repo_root, tmp_path, 1)
    edit(link / "records" / "hopper-fp8.json", lambda r: r.update(artifact="tampered"))
    served = next(v for v in _gate(e1, policy, repo_root, link).verdicts if v.artifact == "hopper-fp8")
    assert "against" in served.floors[1].paired_with  # by value: the records' sha256 does not match


def _release(e1: Path, tmp_path: Path, i: int) -> Path:
    """e1 as release ``i``: the same evaluation of artifacts with other build keys (a new checkpoint
    that happens to evaluate identically), so the registry takes each as a new version."""
    results = Path(shutil.copytree(e1, tmp_path / f"E{i}"))
    for path in results.glob("*/*.json"):
        if path.parent.name != "source":
            edit(path, lambda r: r.update(build_key=f"{r.get('build_key')}-r{i}"))
    return results


def test_the_same_chain_through_the_registry(e1, repo_root, policy, tmp_path):
    from quantgate.publish import RegistryConfig, publish_report
    from support.artifacts import write_artifact

    registry = RegistryConfig.local(tmp_path / "registry")
    seen, bad = [], _damaged(e1, tmp_path)
    for i in range(1, 5):
        results = _release(e1, tmp_path, i)
        report = gate_results(
            results, policy, repo_root, model_class="draft", tenants=["served"], registry=registry
        )
        seen.append(_statuses(report))
        if i > 1:  # a damaged copy fails against every approved version along the chain
            worse = gate_results(
                bad, policy, repo_root, model_class="draft", tenants=["served"], registry=registry
            )
            hopper = next(v for v in worse.verdicts if v.artifact == "hopper-fp8")
            assert [f.status for f in hopper.floors[1:]] == ["fail", "fail"], i
        path = write_report_json(report, tmp_path / f"R{i}", results)
        artifacts = tmp_path / f"A{i}"
        for target in report.approvals:
            write_artifact(artifacts / target, target, {"model.safetensors": f"{target}{i}".encode() * 1000})
        publish_report(path, artifacts, registry)
    assert seen[1] == seen[2] == seen[3]  # the first has nothing to compare with
    hopper = seen[3][("hopper-fp8", "served")]
    assert hopper == (
        "pass",
        ["kld_mean max pass", "kld_mean max_regression pass", "top1_agreement max_regression pass"],
    )
