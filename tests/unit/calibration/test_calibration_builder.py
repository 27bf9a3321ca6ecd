"""Sampling a set from a traffic log: quotas, determinism, errors, shortfalls and the cache."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from quantgate.calibration import (
    CalibrationSet,
    build_set,
    builder,
    cache_key,
    largest_remainder,
    load_or_build,
    load_spec,
    read_traffic_log,
    write_set,
)
from quantgate.runtime.errors import CalibrationError

pytestmark = pytest.mark.unit


@pytest.fixture
def default_spec_path(repo_root, tmp_path) -> Path:
    """A copy of the default spec and its log, so tests may edit the log."""
    shutil.copytree(repo_root / "calibration_sets", tmp_path / "sets")
    return tmp_path / "sets" / "default.yaml"


def write_log(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_spec(
    directory: Path,
    *,
    size: int,
    mix: dict,
    buckets: list[tuple[str, int, float]],
    seed: int = 0,
    log: str = "log.jsonl",
) -> Path:
    lines = ["version: 1", "name: small", f"traffic_log: {log}", f"size: {size}", f"seed: {seed}", "mix:"]
    lines += [f"  {cls}: {share}" for cls, share in mix.items()]
    lines += ["length_buckets:"] + [f"  - {{name: {n}, max_chars: {m}, share: {s}}}" for n, m, s in buckets]
    path = directory / "small.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def records_of(cls: str, lengths: list[int], start: int = 0) -> list[dict]:
    return [{"id": f"{cls}-{start + i}", "class": cls, "text": "x" * n} for i, n in enumerate(lengths)]


# ----------------------------------------------------------------------------- the default set


def test_default_set_mirrors_the_mix(repo_root):
    spec = load_spec(repo_root / "calibration_sets" / "default.yaml")
    cal_set = build_set(spec)
    assert len(cal_set.records) == spec.size == 64
    per_class = Counter(r.class_ for r in cal_set.records)
    assert sum(per_class.values()) == spec.size
    for cls, share in spec.mix.items():
        assert abs(per_class[cls] - spec.size * share) < 1, (cls, per_class[cls])
    assert len({r.id for r in cal_set.records}) == spec.size  # without replacement
    for r in cal_set.records:
        assert spec.bucket_of(r.text) == r.bucket
    assert cal_set.counts == {
        cls: {
            b.name: sum(1 for r in cal_set.records if (r.class_, r.bucket) == (cls, b.name))
            for b in spec.length_buckets
        }
        for cls in spec.mix
    }
    assert cal_set.texts() == [r.text for r in cal_set.records]
    assert cal_set.sha256 == hashlib.sha256(cal_set.jsonl()).hexdigest()


def test_same_seed_same_set_different_seed_different_set(repo_root):
    spec = load_spec(repo_root / "calibration_sets" / "default.yaml")
    first, again = build_set(spec), build_set(spec)
    assert first.sha256 == again.sha256 and first.records == again.records
    other = build_set(spec.model_copy(update={"seed": 1}))
    assert other.sha256 != first.sha256


def test_changing_one_record_changes_the_hash(default_spec_path):
    spec = load_spec(default_spec_path)
    before = build_set(spec)
    chosen = before.records[0].id
    lines = spec.traffic_log.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["id"] == chosen:
            last = "?" if rec["text"][-1] != "?" else "!"
            rec["text"] = rec["text"][:-1] + last  # same length, so the same bucket
            lines[i] = json.dumps(rec, ensure_ascii=False) + "\n"
    log_bytes = "".join(lines).encode()
    old_key = cache_key(spec, spec.traffic_log.read_bytes())
    spec.traffic_log.write_bytes(log_bytes)
    after = build_set(spec)
    assert [r.id for r in after.records] == [r.id for r in before.records]  # same selection...
    assert after.sha256 != before.sha256  # ...different identity
    assert after.source_key == cache_key(spec, log_bytes) != old_key


def test_set_rejects_a_hash_that_does_not_match(repo_root):
    cal_set = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    with pytest.raises(ValueError, match="does not match the records"):
        CalibrationSet(**{**cal_set.model_dump(by_alias=True), "sha256": "0" * 64})


# ----------------------------------------------------------------------------- errors


def test_class_missing_from_the_log_names_class_and_log(tmp_path):
    log = write_log(tmp_path / "log.jsonl", records_of("chat", [10] * 5) + records_of("tool_call", [10] * 5))
    mix = {"chat": 0.5, "tool_calls": 0.5}
    spec = load_spec(write_spec(tmp_path, size=4, mix=mix, buckets=[("all", 100, 1.0)]))
    with pytest.raises(CalibrationError) as err:
        build_set(spec)
    message = str(err.value)
    assert err.value.path == str(log)
    assert "class 'tool_calls'" in message and "did you mean 'tool_call'?" in message
    assert "classes in the log: chat, tool_call" in message and "remove 'tool_calls' from mix" in message


def test_class_without_enough_records_says_how_many(tmp_path):
    math = records_of("math", [10] * 3 + [500] * 4)  # the long ones fit no bucket
    write_log(tmp_path / "log.jsonl", records_of("chat", [10] * 20) + math)
    mix = {"chat": 0.5, "math": 0.5}
    spec = load_spec(write_spec(tmp_path, size=20, mix=mix, buckets=[("all", 100, 1.0)]))
    expected = r"class 'math' needs 10 records .* has only 3 within 100 characters"
    expected += r".*add at least 7 'math' records"
    with pytest.raises(CalibrationError, match=expected):
        build_set(spec)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": "b", "class": "chat", "text": "hi"', "not valid JSON"),
        ('["b", "chat", "hi"]', "expected a JSON object, got list"),
        ('{"id": "b", "text": "hi"}', "'class' is missing"),
        ('{"id": "b", "class": "chat", "text": 3}', "'text' must be a non-empty string"),
        ('{"id": "a", "class": "chat", "text": "again"}', "id 'a' repeats line 1"),
    ],
)
def test_malformed_log_line_names_file_and_line(tmp_path, line, problem):
    log = tmp_path / "log.jsonl"
    log.write_text('{"id": "a", "class": "chat", "text": "hello"}\n\n' + line + "\n")
    with pytest.raises(CalibrationError) as err:
        read_traffic_log(log)
    assert err.value.path == f"{log}:3"
    assert problem in str(err.value) and "Fix:" in str(err.value)


def test_missing_log_is_a_calibration_error(tmp_path):
    spec = load_spec(write_spec(tmp_path, size=1, mix={"chat": 1.0}, buckets=[("all", 100, 1.0)]))
    with pytest.raises(CalibrationError, match="traffic log not found"):
        build_set(spec)


# ----------------------------------------------------------------------------- quotas


def test_largest_remainder_sums_exactly_and_breaks_ties_in_order():
    from fractions import Fraction as F

    assert largest_remainder(64, [F(7, 20), F(1, 5), F(3, 20), F(3, 20), F(3, 20)]) == [22, 13, 10, 10, 9]
    assert largest_remainder(10, [F(1, 3)] * 3) == [4, 3, 3]
    assert largest_remainder(5, [F(0), F(0)]) == [3, 2]
    assert largest_remainder(0, [F(1), F(2)]) == [0, 0]


def test_shortfall_moves_to_other_buckets_of_the_same_class(tmp_path):
    # quotas for 'a' (size 10): short 5, medium 3, long 2; only 1 short record exists
    write_log(
        tmp_path / "log.jsonl",
        records_of("a", [5] + [50] * 10 + [500] * 10) + records_of("b", [5] * 10, start=100),
    )
    spec = load_spec(
        write_spec(
            tmp_path,
            size=20,
            mix={"a": 0.5, "b": 0.5},
            buckets=[("short", 10, 0.5), ("medium", 100, 0.3), ("long", 1000, 0.2)],
        )
    )
    cal_set = build_set(spec)
    assert cal_set.counts["a"] == {"short": 1, "medium": 5, "long": 4}  # 4 moved, 3:2 by share -> +2, +2
    assert cal_set.counts["b"] == {"short": 10, "medium": 0, "long": 0}
    assert Counter(r.class_ for r in cal_set.records) == {"a": 10, "b": 10}
    note = next(n for n in cal_set.notes if n.startswith("a: "))
    assert note == "a: 'short' wanted 5, has 1; the shortfall of 4 moved to 'medium' +2, 'long' +2"
    assert any(n.startswith("b: ") for n in cal_set.notes)  # b has nothing but short texts


def test_shortfall_respects_what_the_other_buckets_hold(tmp_path):
    # quotas: short 4, medium 4, long 2; short has 0, medium has 5: medium takes 1, long the rest
    write_log(tmp_path / "log.jsonl", records_of("a", [50] * 5 + [500] * 10))
    spec = load_spec(
        write_spec(
            tmp_path,
            size=10,
            mix={"a": 1.0},
            buckets=[("short", 10, 0.4), ("medium", 100, 0.4), ("long", 1000, 0.2)],
        )
    )
    assert build_set(spec).counts["a"] == {"short": 0, "medium": 5, "long": 5}


def test_records_longer_than_every_bucket_are_left_out_and_noted(tmp_path):
    write_log(tmp_path / "log.jsonl", records_of("a", [5] * 6 + [5000] * 2))
    spec = load_spec(write_spec(tmp_path, size=6, mix={"a": 1.0}, buckets=[("all", 100, 1.0)]))
    cal_set = build_set(spec)
    assert all(len(t) == 5 for t in cal_set.texts())
    assert "a: 2 records longer than 100 characters were left out" in cal_set.notes


def test_log_path_argument_overrides_the_spec(tmp_path):
    write_log(tmp_path / "log.jsonl", records_of("a", [5] * 4))
    other = write_log(tmp_path / "other.jsonl", records_of("a", [7] * 4))
    spec = load_spec(write_spec(tmp_path, size=2, mix={"a": 1.0}, buckets=[("all", 100, 1.0)]))
    assert all(len(t) == 7 for t in build_set(spec, log_path=other).texts())


# ----------------------------------------------------------------------------- writing and the cache


def test_write_set_names_the_file_by_hash_and_writes_a_sidecar(repo_root, tmp_path):
    cal_set = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    path = write_set(cal_set, tmp_path / "cache")
    assert path.name == f"default-{cal_set.sha256[:12]}.jsonl"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == cal_set.sha256
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["sha256"] == cal_set.sha256 and sidecar["size"] == 64
    assert sidecar["counts"] == cal_set.counts and sidecar["source_keys"] == [cal_set.source_key]
    # nothing else: no temporary files left behind
    assert sorted(p.name for p in path.parent.iterdir()) == [path.with_suffix(".json").name, path.name]


def test_load_or_build_reuses_a_written_set(default_spec_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    written = write_set(build_set(load_spec(default_spec_path)), cache)
    mtime = written.stat().st_mtime_ns

    def no_sampling(*args, **kwargs):
        raise AssertionError("load_or_build sampled again instead of reusing the cache")

    monkeypatch.setattr(builder, "build_set", no_sampling)
    cal_set = load_or_build(default_spec_path, cache)
    assert written.name == f"default-{cal_set.sha256[:12]}.jsonl"
    assert len(cal_set.records) == 64 and written.stat().st_mtime_ns == mtime


def test_load_or_build_samples_again_when_the_log_changes(default_spec_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    calls = []
    real = builder.build_set
    monkeypatch.setattr(builder, "build_set", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = load_or_build(default_spec_path, cache)
    assert load_or_build(default_spec_path, cache) == first and len(calls) == 1

    log = load_spec(default_spec_path).traffic_log
    log.write_text(log.read_text() + json.dumps({"id": "new", "class": "chat", "text": "hello there"}) + "\n")
    second = load_or_build(default_spec_path, cache)
    assert len(calls) == 2 and second.source_key != first.source_key
    assert (cache / f"default-{second.sha256[:12]}.jsonl").is_file()


def test_one_written_set_serves_every_spec_that_produces_it(default_spec_path, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = load_or_build(default_spec_path, cache)
    text = default_spec_path.read_text()
    default_spec_path.write_text(text.replace("description: ", "description: reworded, "))
    second = load_or_build(default_spec_path, cache)  # a new key, the same records
    assert second.sha256 == first.sha256 and second.source_key != first.source_key
    sidecar = json.loads((cache / f"default-{first.sha256[:12]}.json").read_text())
    assert sidecar["source_keys"] == [first.source_key, second.source_key]
    monkeypatch.setattr(builder, "build_set", None)  # both keys are now served from the cache
    default_spec_path.write_text(text)
    assert load_or_build(default_spec_path, cache).source_key == first.source_key


def test_load_or_build_replaces_a_damaged_cache_file(default_spec_path, tmp_path):
    cache = tmp_path / "cache"
    first = load_or_build(default_spec_path, cache)
    path = cache / f"default-{first.sha256[:12]}.jsonl"
    path.write_text(path.read_text().replace("a", "b", 1))
    again = load_or_build(default_spec_path, cache)
    assert again == first
    assert hashlib.sha256(path.read_bytes()).hexdigest() == first.sha256


def test_texts_with_unicode_line_separators_round_trip(tmp_path, monkeypatch):
    texts = ["line\u2028separator", "para\u2029graph", "form\x0cfeed", "caf\u00e9 \u2603", "plain"]
    records = [{"id": f"r{i}", "class": "a", "text": t} for i, t in enumerate(texts)]
    write_log(tmp_path / "log.jsonl", records)
    spec_path = write_spec(tmp_path, size=5, mix={"a": 1.0}, buckets=[("all", 100, 1.0)])
    assert [r["text"] for r in read_traffic_log(tmp_path / "log.jsonl")] == texts
    built = load_or_build(spec_path, tmp_path / "cache")
    assert sorted(built.texts()) == sorted(texts)
    monkeypatch.setattr(builder, "build_set", None)
    assert load_or_build(spec_path, tmp_path / "cache") == built


def test_a_sidecar_that_misdescribes_its_file_is_not_trusted(default_spec_path, tmp_path):
    cache = tmp_path / "cache"
    first = load_or_build(default_spec_path, cache)
    sidecar = cache / f"default-{first.sha256[:12]}.json"
    meta = json.loads(sidecar.read_text())
    meta["counts"]["chat"]["short"] += 1
    sidecar.write_text(json.dumps(meta))
    again = load_or_build(default_spec_path, cache)
    assert again.counts == first.counts
    assert json.loads(sidecar.read_text())["counts"] == first.counts  # rewritten
