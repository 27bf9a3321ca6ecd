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
    # the approved version's kld_mean (0.0317), not its floor's estimate (its own change, 0): no change.
    # Unpaired, against a value three quarters of the way to its limit, 128 windows cannot certify
    # it: an artifact at the approved value itself would need about 160 (insufficient, never a fail)
    assert abs(kl.estimate) < 1e-6 and kl.before == pytest.approx(0.0317, abs=1e-4)
    assert (
        kl.status == "insufficient_evidence" and "an artifact at the approved value passes from" in kl.reason
    )
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


@pytest.mark.heavy
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


def _regressed(e1: Path, tmp_path: Path, i: int) -> Path:
    """Release ``i`` of a mildly regressed hopper-fp8: every traffic window's KL 0.02 above release 0's
    (within the absolute 0.5, beyond the 0.01 regression floor), with its own build keys."""
    results = _release(e1, tmp_path, 100 + i)

    def worse(r):
        for s in r["samples"]:
            s["kld_mean"] += 0.02
        r["metrics"]["kld_mean"] += 0.02

    edit(results / "hopper-fp8" / "traffic.json", worse)
    return results


@pytest.mark.heavy
def test_a_tenant_the_previous_report_failed_is_compared_with_what_it_is_still_served(
    e1, repo_root, policy, tmp_path
):
    """Issue 43, finding 6: a tenant the previous report did not approve was treated as a first
    release by ``--previous`` (regressed links went fail, pass, pass, pass), while the registry kept
    comparing with the version still approved (fail, fail, fail, fail). Both paths now agree."""
    from quantgate.publish import RegistryConfig, publish_report
    from support.artifacts import write_artifact

    registry = RegistryConfig.local(tmp_path / "registry")
    base = _release(e1, tmp_path, 0)
    first = gate_results(base, policy, repo_root, model_class="draft", tenants=["served"], registry=registry)
    assert "served" in first.approvals["hopper-fp8"]
    offline = tmp_path / "P0"
    path = write_report_json(first, offline, base)
    artifacts = tmp_path / "A0"
    for target in first.approvals:
        write_artifact(artifacts / target, target, {"model.safetensors": f"{target}0".encode() * 1000})
    publish_report(path, artifacts, registry)

    by_registry, by_previous = [], []
    for i in range(1, 5):
        results = _regressed(e1, tmp_path, i)
        online = gate_results(
            results, policy, repo_root, model_class="draft", tenants=["served"], registry=registry
        )
        chained = gate_results(
            results, policy, repo_root, model_class="draft", tenants=["served"], previous=offline
        )
        by_registry.append(_statuses(online)[("hopper-fp8", "served")])
        by_previous.append(_statuses(chained)[("hopper-fp8", "served")])
        offline = tmp_path / f"P{i}"
        write_report_json(chained, offline, results)
        path = write_report_json(online, tmp_path / f"R{i}", results)
        artifacts = tmp_path / f"A{i}"
        for target in online.approvals:
            write_artifact(artifacts / target, target, {"model.safetensors": f"{target}{i}".encode() * 1000})
        publish_report(path, artifacts, registry)
        # the version still served is release 0, on both paths, and its copy is kept beside the report
        assert (offline / "baselines" / "hopper-fp8" / "served" / "report.json").exists()
    assert by_registry == by_previous
    assert [v for v, _ in by_previous] == ["fail"] * 4
    assert all("kld_mean max_regression fail" in floors for _, floors in by_previous)


def test_a_previous_report_that_kept_no_copy_of_its_baseline_is_never_a_first_release(
    e1, repo_root, policy, tmp_path
):
    base = _release(e1, tmp_path, 0)
    first = _gate(base, policy, repo_root, None)
    write_report_json(first, tmp_path / "P0", base)
    regressed = _regressed(e1, tmp_path, 1)
    second = _gate(regressed, policy, repo_root, tmp_path / "P0")
    write_report_json(second, tmp_path / "P1", regressed)
    shutil.rmtree(tmp_path / "P1" / "baselines")
    third = _gate(regressed, policy, repo_root, tmp_path / "P1")
    served = next(v for v in third.verdicts if v.artifact == "hopper-fp8")
    regression = served.floors[1]
    assert regression.status == "insufficient_evidence" and "keeps no copy" in regression.reason
    assert served.verdict == "fail"
