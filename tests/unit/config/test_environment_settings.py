"""Environment settings (issue 25): a bad value is one line naming the variable and the fix, exit 2.

Before ``config.environment``, ``QUANTGATE_PULL_CACHE_MAX_GB=abc`` was a ValueError traceback,
``=inf`` an OverflowError, ``QUANTGATE_TRANSFER_CONCURRENCY=abc`` a pydantic ValidationError,
``=10**30`` accepted (a thread pool of that size), ``pull_cache_max_gb: 1e300`` in registry.yaml
an OverflowError, and ``QUANTGATE_CACHE=~nosuchuser/x`` a RuntimeError.
"""

from __future__ import annotations

import pytest

from quantgate.publish import RegistryConfig
from quantgate.runtime.errors import InputError
from support.cli import quantgate as cli

pytestmark = pytest.mark.unit

BAD = [
    ("QUANTGATE_PULL_CACHE_MAX_GB", "abc", "valid number"),
    ("QUANTGATE_PULL_CACHE_MAX_GB", "inf", "finite number"),
    ("QUANTGATE_PULL_CACHE_MAX_GB", "nan", "finite number"),
    ("QUANTGATE_PULL_CACHE_MAX_GB", "1e300", "less than or equal to"),
    ("QUANTGATE_PULL_CACHE_MAX_GB", "0", "greater than or equal to"),
    ("QUANTGATE_TRANSFER_CONCURRENCY", "abc", "valid integer"),
    ("QUANTGATE_TRANSFER_CONCURRENCY", "9" * 30, "less than or equal to 256"),
    ("QUANTGATE_S3_MAX_ATTEMPTS", "0", "greater than or equal to 1"),
    ("QUANTGATE_PULL_VERIFY", "sometimes", "'always' or 'offline'"),
]


@pytest.mark.parametrize(("name", "value", "why"), BAD, ids=[f"{n}={v[:8]}" for n, v, _ in BAD])
def test_a_bad_setting_names_the_variable_and_the_fix(tmp_path, name, value, why):
    with pytest.raises(InputError) as err:
        RegistryConfig.from_env(tmp_path, environ={name: value})
    message = str(err.value)
    assert message.startswith(f"{name}: ") and why in message and "\n" not in message
    assert f"Fix: set {name} to a valid value, or unset it" in message


def test_good_settings_are_read_as_before(tmp_path):
    cfg = RegistryConfig.from_env(
        tmp_path,
        environ={
            "QUANTGATE_PULL_CACHE_MAX_GB": " 2.5 ",
            "QUANTGATE_TRANSFER_CONCURRENCY": "3",
            "QUANTGATE_S3_MAX_ATTEMPTS": "7",
            "QUANTGATE_PULL_VERIFY": "offline",
        },
    )
    assert cfg.cache_max_bytes == 2_500_000_000
    assert (cfg.transfer.concurrency, cfg.transfer.max_attempts, cfg.pull_verify) == (3, 7, "offline")
    assert (
        RegistryConfig.from_env(tmp_path, environ={"QUANTGATE_PULL_CACHE_MAX_GB": ""}).cache_max_bytes
        == 10**11
    )


def test_a_huge_cache_size_in_registry_yaml_is_refused_naming_its_line(tmp_path):
    settings = tmp_path / "artifacts_registry" / "registry.yaml"
    settings.parent.mkdir()
    settings.write_text("version: 1\npull_cache_max_gb: 1.0e+300\n")  # finite, but inf bytes
    with pytest.raises(InputError, match=f"{settings}:2: pull_cache_max_gb: Input should be less than"):
        RegistryConfig.from_env(tmp_path, environ={})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("QUANTGATE_PULL_CACHE_MAX_GB", "inf"),
        ("QUANTGATE_TRANSFER_CONCURRENCY", "abc"),
        ("QUANTGATE_CACHE", "~nosuchuser-quantgate/cache"),
    ],
)
def test_pull_with_a_bad_setting_exits_2_in_one_line(tmp_path, name, value):
    run = cli("pull", "m", "--target", "hopper-fp8", "--tenant", "chat", env={name: value}, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {name}: "), lines
