"""The spec format: shares, bucket order, typos, and where the traffic log resolves."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from quantgate.calibration import CalibrationSpec, load_spec
from quantgate.runtime.errors import ConfigFileError, InputError

pytestmark = pytest.mark.unit

SPEC = """\
version: 1
name: tiny
traffic_log: log.jsonl
size: 10
seed: 3
mix:
  chat: 0.6
  code: 0.4
length_buckets:
  - {name: short, max_chars: 100, share: 0.5}
  - {name: long, max_chars: 1000, share: 0.5}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def test_default_spec_loads_and_resolves_the_log(repo_root):
    spec = load_spec(repo_root / "calibration_sets" / "default.yaml")
    assert spec.name == "default" and spec.size == 64
    assert spec.traffic_log == repo_root / "calibration_sets" / "traffic" / "default-traffic.jsonl"
    assert spec.traffic_log.is_file()
    assert list(spec.mix) == ["chat", "code", "math", "long_document", "tool_call"]


def test_traffic_log_is_relative_to_the_spec_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # not where the spec is
    spec = load_spec(write(tmp_path, SPEC))
    assert spec.traffic_log == (tmp_path / "log.jsonl").resolve()


def test_mix_not_summing_to_one_names_file_and_line(tmp_path):
    path = write(tmp_path, SPEC.replace("code: 0.4", "code: 0.3"))
    with pytest.raises(ConfigFileError) as err:
        load_spec(path)
    message = str(err.value)
    assert f"{path}:7" in message  # the first line of the mix mapping
    assert "mix shares sum to 0.9" in message and "not 1" in message
    assert isinstance(err.value, InputError) and err.value.exit_code == 2


def test_bucket_shares_not_summing_to_one_names_file_and_line(tmp_path):
    path = write(tmp_path, SPEC.replace("max_chars: 1000, share: 0.5", "max_chars: 1000, share: 0.6"))
    expected = rf"{path}:10: length_buckets: .*length_buckets shares sum to 1.1, not 1"
    with pytest.raises(ConfigFileError, match=expected):
        load_spec(path)


def test_shares_within_tolerance_are_accepted(tmp_path):
    thirds = "mix:\n  chat: 0.3333333333333333\n  code: 0.3333333333333333\n  math: 0.3333333333333334\n"
    text = SPEC.replace("mix:\n  chat: 0.6\n  code: 0.4\n", thirds)
    assert sum(load_spec(write(tmp_path, text)).mix.values()) == pytest.approx(1.0)


def test_typo_in_a_key_suggests_the_nearest(tmp_path):
    path = write(tmp_path, SPEC.replace("seed: 3", "sede: 3"))
    with pytest.raises(ConfigFileError, match=rf"{path}:5: .*unknown key 'sede' \(did you mean 'seed'\?\)"):
        load_spec(path)


def test_typo_inside_a_bucket_suggests_the_nearest(tmp_path):
    path = write(tmp_path, SPEC.replace("max_chars: 100,", "max_char: 100,"))
    with pytest.raises(ConfigFileError, match=r"did you mean 'max_chars'\?"):
        load_spec(path)


def test_buckets_must_be_ordered_by_max_chars(tmp_path):
    path = write(tmp_path, SPEC.replace("max_chars: 1000", "max_chars: 50"))
    with pytest.raises(ConfigFileError, match="max_chars must strictly increase"):
        load_spec(path)


def test_bucket_of_picks_the_first_bucket_that_holds_the_text(tmp_path):
    spec = load_spec(write(tmp_path, SPEC))
    assert spec.bucket_of("x" * 100) == "short"
    assert spec.bucket_of("x" * 101) == "long"
    assert spec.bucket_of("x" * 1001) is None


def test_spec_is_frozen(tmp_path):
    spec = load_spec(write(tmp_path, SPEC))
    with pytest.raises(ValidationError, match="frozen"):
        spec.size = 3  # type: ignore[misc]
    assert isinstance(spec, CalibrationSpec)
