"""The rollout policy in gates.yaml: defaults, and errors that name the file and the field."""

from __future__ import annotations

import pytest

from quantgate.config import canary_shares, load_rollout
from quantgate.runtime.errors import ConfigFileError

pytestmark = pytest.mark.unit


def test_defaults_and_the_tenants_confidence(tmp_path):
    path = tmp_path / "gates.yaml"
    path.write_text(
        "tenants:\n  chat: {confidence: 0.9, rollout: {strategy: canary, share: 0.05}}\n  batch: {}\n"
    )
    policies = load_rollout(path)
    policy, confidence = policies["chat"]
    assert (policy.strategy, policy.share, confidence) == ("canary", 0.05, 0.9)
    assert policies["batch"][0].strategy == "direct" and policies["batch"][1] == 0.95
    assert canary_shares(path) == {"chat": 0.05}
    assert canary_shares(tmp_path / "absent.yaml") == {}


@pytest.mark.parametrize(
    ("rollout", "words"),
    [
        ("{share: 1.5}", "tenants.chat.rollout.share"),
        ("{stratgy: canary}", "stratgy"),
        ("{at_max_duration: wait}", "at_max_duration"),
        ("{replay: {max_kl: 2.0, kl_cap: 1.0}}", "kl_cap"),
    ],
)
def test_a_bad_policy_is_refused_naming_gates_yaml(tmp_path, rollout, words):
    path = tmp_path / "gates.yaml"
    path.write_text(f"tenants:\n  chat: {{rollout: {rollout}}}\n")
    with pytest.raises(ConfigFileError, match="gates.yaml") as err:
        load_rollout(path)
    assert words in str(err.value)


def test_the_projects_gates_yaml_still_validates(repo_root, catalog):
    from quantgate.config import load_gates

    gates = load_gates(repo_root / "gates.yaml", catalog)
    assert all(t.rollout.strategy in ("canary", "direct") for t in gates.tenants.values())
