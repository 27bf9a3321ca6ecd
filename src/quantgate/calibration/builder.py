"""Sample a calibration set from a traffic log, as a spec declares, and cache it by content.

The set must mirror production traffic (class mix, lengths) and be reproducible, because its
sha256 enters every calibrated artifact's build key: sampling is deterministic for a seed, the
quotas sum to the declared size exactly, and the set's identity is the sha256 of the exact bytes
``write_set`` writes (``sha256sum`` of the file equals ``CalibrationSet.sha256``), which depends
on the texts, not on any tokenizer. ``load_or_build`` reuses a written set while the spec's
content and the log's bytes are unchanged (``cache_key``).
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path
from random import Random

from pydantic import ConfigDict, Field, model_validator

from quantgate.calibration.spec import CalibrationSpec, load_spec
from quantgate.runtime.atomic import write_bytes, write_json
from quantgate.runtime.errors import CalibrationError
from quantgate.runtime.frozen import Frozen
from quantgate.runtime.suggest import did_you_mean

SAMPLER_VERSION = 1  # bump when sampling changes, so cached sets are not reused across it
LOG_FIX = 'write one JSON object per line: {"id": "...", "class": "chat", "text": "..."}'


class CalibrationRecord(Frozen):
    """One sampled record: the log's id, class and text, and the length bucket it fell in."""

    model_config = ConfigDict(populate_by_name=True)

    id: str
    class_: str = Field(alias="class")
    bucket: str
    text: str

    def canonical(self) -> str:
        """The record as one canonical JSON line (sorted keys, no spaces, UTF-8 kept)."""
        fields = self.model_dump(by_alias=True)
        return json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _canonical_jsonl(records: tuple[CalibrationRecord, ...] | list[CalibrationRecord]) -> bytes:
    return "".join(r.canonical() + "\n" for r in records).encode("utf-8")


class CalibrationSet(Frozen):
    """A sampled set: its records in order, counts per class and bucket, and its sha256.

    The sha256 is over the canonical JSONL (``CalibrationRecord.canonical``, one record a line),
    and a set whose records do not hash to it is refused.
    """

    name: str
    records: tuple[CalibrationRecord, ...]
    counts: dict[str, dict[str, int]] = Field(description="class -> bucket -> records")
    sha256: str
    notes: tuple[str, ...] = Field(default=(), description="shortfall moves and records left out")
    source_key: str | None = Field(default=None, description="cache_key of the spec and log it came from")

    @model_validator(mode="after")
    def _sha_matches(self) -> CalibrationSet:
        actual = hashlib.sha256(self.jsonl()).hexdigest()
        if actual != self.sha256:
            raise ValueError(f"sha256 {self.sha256} does not match the records (they hash to {actual})")
        return self

    @classmethod
    def from_records(
        cls,
        name: str,
        records: list[CalibrationRecord],
        counts: dict[str, dict[str, int]],
        notes: list[str] | tuple[str, ...] = (),
        source_key: str | None = None,
    ) -> CalibrationSet:
        """The set of ``records``, its sha256 computed from them."""
        sha = hashlib.sha256(_canonical_jsonl(records)).hexdigest()
        return cls(
            name=name,
            records=tuple(records),
            counts=counts,
            sha256=sha,
            notes=tuple(notes),
            source_key=source_key,
        )

    def jsonl(self) -> bytes:
        """The canonical JSONL bytes: what ``write_set`` writes and what ``sha256`` hashes."""
        return _canonical_jsonl(self.records)

    def texts(self) -> list[str]:
        """The records' texts, in order: what a calibrated engine feeds the model."""
        return [r.text for r in self.records]


# ------------------------------------------------------------------------------ the traffic log


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CalibrationError(
            path, "traffic log not found", "check traffic_log in the spec (it is relative to the spec file)"
        ) from None


def _parse_log(path: Path, data: bytes) -> list[dict[str, str]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = data[: exc.start].count(b"\n") + 1
        raise CalibrationError(f"{path}:{bad_line}", "not valid UTF-8", "save the log as UTF-8") from None
    records: list[dict[str, str]] = []
    seen: dict[str, int] = {}
    # split on \n only: str.splitlines would also split on U+2028 and others, which JSON leaves raw
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problem = f"not valid JSON ({exc.msg} at column {exc.colno})"
            raise CalibrationError(where, problem, LOG_FIX) from None
        if not isinstance(obj, dict):
            raise CalibrationError(where, f"expected a JSON object, got {type(obj).__name__}", LOG_FIX)
        for key in ("id", "class", "text"):
            if not isinstance(obj.get(key), str) or not obj[key]:
                problem = f"'{key}' is missing" if key not in obj else f"'{key}' must be a non-empty string"
                raise CalibrationError(where, problem, LOG_FIX)
        if obj["id"] in seen:
            raise CalibrationError(
                where, f"id '{obj['id']}' repeats line {seen[obj['id']]}", "give every record its own id"
            )
        seen[obj["id"]] = lineno
        records.append({"id": obj["id"], "class": obj["class"], "text": obj["text"]})
    if not records:
        raise CalibrationError(path, "the traffic log has no records", LOG_FIX)
    return records


def read_traffic_log(path: str | Path) -> list[dict[str, str]]:
    """The log's records as ``{"id", "class", "text"}`` dicts, in file order (other keys dropped)."""
    path = Path(path)
    return _parse_log(path, _read_bytes(path))


# ------------------------------------------------------------------------------ apportionment


def largest_remainder(total: int, weights: list[Fraction]) -> list[int]:
    """Split ``total`` in proportion to ``weights`` into integers summing to ``total`` exactly.

    Each part is the floor of its exact share, plus one for the largest remainders; ties go to
    the earlier weight. Equal weights are used when all weights are zero.
    """
    if not weights:
        return []
    weight_sum = sum(weights)
    if weight_sum == 0:
        weights, weight_sum = [Fraction(1)] * len(weights), Fraction(len(weights))
    exact = [total * w / weight_sum for w in weights]
    parts = [int(e) for e in exact]  # floor: all non-negative
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _exact(share: float) -> Fraction:
    """The share as written in YAML (0.35 is 7/20, not the nearest binary float)."""
    return Fraction(repr(share))


Cells = dict[str, dict[str, int]]  # class -> bucket -> records


def _plan(spec: CalibrationSpec, available: Cells, log: Path) -> tuple[Cells, list[str]]:
    """Quotas per (class, bucket), after moving shortfalls within each class; and notes.

    Class quotas are ``size * mix[class]`` apportioned by largest remainder (ties go to the
    class declared first); each class quota is split over the length buckets the same way by
    their shares. A cell with fewer records than its quota gives its shortfall to the class's
    other buckets, in proportion to their shares and up to what they hold, noting the move.
    Only a class that lacks records as a whole is an error.
    """
    classes, buckets = list(spec.mix), [b.name for b in spec.length_buckets]
    bucket_shares = [_exact(b.share) for b in spec.length_buckets]
    class_quota = largest_remainder(spec.size, [_exact(spec.mix[c]) for c in classes])
    quotas: Cells = {}
    notes: list[str] = []
    for cls, quota in zip(classes, class_quota, strict=True):
        have = available[cls]
        total = sum(have.values())
        if total < quota:
            raise CalibrationError(
                log,
                f"class '{cls}' needs {quota} records (size {spec.size} x share {spec.mix[cls]}) but the log "
                f"has only {total} within {spec.length_buckets[-1].max_chars} characters",
                f"add at least {quota - total} '{cls}' records to the log, or lower size or the share of "
                f"'{cls}' in mix",
            )
        cell = dict(zip(buckets, largest_remainder(quota, bucket_shares), strict=True))
        short = {b: cell[b] - have[b] for b in buckets if cell[b] > have[b]}
        for b in short:
            cell[b] = have[b]
        missing, moved = sum(short.values()), dict.fromkeys(buckets, 0)
        while missing:
            spare = [b for b in buckets if have[b] > cell[b]]
            extra = largest_remainder(missing, [bucket_shares[buckets.index(b)] for b in spare])
            for b, e in zip(spare, extra, strict=True):
                add = min(e, have[b] - cell[b])
                cell[b] += add
                moved[b] += add
                missing -= add
        if short:
            wanted = "; ".join(f"'{b}' wanted {have[b] + n}, has {have[b]}" for b, n in short.items())
            to = ", ".join(f"'{b}' +{n}" for b, n in moved.items() if n)
            notes.append(f"{cls}: {wanted}; the shortfall of {sum(short.values())} moved to {to}")
        quotas[cls] = cell
    return quotas, notes


# ------------------------------------------------------------------------------ building


def cache_key(spec: CalibrationSpec, log_bytes: bytes) -> str:
    """sha256 over the sampler version, the spec's validated content and the log's bytes.

    The spec's content rather than its bytes: ``include:``d files count, comments do not, and
    the (absolute) location of the log does not either, only what it holds.
    """
    h = hashlib.sha256(f"quantgate-calibration sampler {SAMPLER_VERSION}\n".encode())
    h.update(spec.model_dump_json(exclude={"traffic_log"}).encode())
    h.update(b"\n" + hashlib.sha256(log_bytes).digest())
    return h.hexdigest()


def build_set(spec: CalibrationSpec, log_path: str | Path | None = None) -> CalibrationSet:
    """Sample the set ``spec`` declares from its traffic log (or from ``log_path``).

    A record falls in the first length bucket whose ``max_chars`` holds its text (longer ones
    are left out, and the notes say how many). Sampling is ``random.Random(seed)``: without
    replacement within each cell, cells visited in spec order, the selection then shuffled with
    the same generator, so the output order is deterministic too.
    """
    log = Path(log_path) if log_path is not None else spec.traffic_log
    data = _read_bytes(log)
    records = _parse_log(log, data)
    buckets = [b.name for b in spec.length_buckets]
    log_classes = sorted({r["class"] for r in records})
    for cls in spec.mix:
        if cls not in log_classes:
            raise CalibrationError(
                log,
                f"class '{cls}' from the spec's mix has no records in this traffic log",
                did_you_mean(cls, log_classes, known="classes in the log")
                + f"; add '{cls}' records to the log, or remove '{cls}' from mix",
            )
    cells: dict[str, dict[str, list[dict[str, str]]]] = {c: {b: [] for b in buckets} for c in spec.mix}
    too_long: dict[str, int] = {}
    for rec in records:
        if rec["class"] not in cells:
            continue
        bucket = spec.bucket_of(rec["text"])
        if bucket is None:
            too_long[rec["class"]] = too_long.get(rec["class"], 0) + 1
        else:
            cells[rec["class"]][bucket].append(rec)
    notes = [
        f"{cls}: {n} records longer than {spec.length_buckets[-1].max_chars} characters were left out"
        for cls, n in too_long.items()
    ]
    available = {c: {b: len(v) for b, v in cells[c].items()} for c in cells}
    quotas, plan_notes = _plan(spec, available, log)

    rng = Random(spec.seed)
    selected: list[CalibrationRecord] = []
    for cls in spec.mix:
        for bucket in buckets:
            for rec in rng.sample(cells[cls][bucket], quotas[cls][bucket]):
                selected.append(
                    CalibrationRecord.model_validate(
                        {"id": rec["id"], "class": cls, "bucket": bucket, "text": rec["text"]}
                    )
                )
    rng.shuffle(selected)
    return CalibrationSet.from_records(spec.name, selected, quotas, notes + plan_notes, cache_key(spec, data))


# ------------------------------------------------------------------------------ the cache


def _sidecar_path(data_path: Path) -> Path:
    return data_path.with_suffix(".json")


def write_set(cal_set: CalibrationSet, directory: str | Path) -> Path:
    """Write ``<name>-<sha256[:12]>.jsonl`` and its sidecar ``.json``; return the JSONL's path.

    Both are written atomically (``quantgate.runtime.atomic``), the data before the
    sidecar, so a sidecar always describes a complete file. The sidecar keeps every cache key
    known to produce this set.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"{cal_set.name}-{cal_set.sha256[:12]}.jsonl"
    write_bytes(data_path, cal_set.jsonl())
    keys: list[str] = []
    try:
        keys = list(json.loads(_sidecar_path(data_path).read_text())["source_keys"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if cal_set.source_key and cal_set.source_key not in keys:
        keys.append(cal_set.source_key)
    sidecar = {
        "format": 1,
        "name": cal_set.name,
        "sha256": cal_set.sha256,
        "size": len(cal_set.records),
        "counts": cal_set.counts,
        "notes": list(cal_set.notes),
        "source_keys": keys,
    }
    write_json(_sidecar_path(data_path), sidecar, indent=2, sort_keys=True)
    return data_path


def _read_cached(sidecar_path: Path, key: str) -> CalibrationSet | None:
    """The set a sidecar describes, if it lists ``key`` and its data file is intact."""
    try:
        meta = json.loads(sidecar_path.read_text())
        if key not in meta["source_keys"]:
            return None
        data = sidecar_path.with_suffix(".jsonl").read_bytes()
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            return None  # damaged or half-replaced: sample again and overwrite
        lines = data.decode().split("\n")[:-1]  # canonical JSONL ends every line with \n
        records = [CalibrationRecord.model_validate(json.loads(line)) for line in lines]
        counts = {c: dict.fromkeys(buckets, 0) for c, buckets in meta["counts"].items()}
        for r in records:
            counts[r.class_][r.bucket] += 1
        if counts != meta["counts"]:
            return None  # a sidecar that does not describe its file
        return CalibrationSet(
            name=meta["name"],
            records=tuple(records),
            counts=meta["counts"],
            sha256=meta["sha256"],
            notes=tuple(meta["notes"]),
            source_key=key,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_or_build(spec_path: str | Path, cache_dir: str | Path) -> CalibrationSet:
    """The set ``spec_path`` declares: from ``cache_dir`` when the spec and log are unchanged."""
    spec = load_spec(spec_path)
    key = cache_key(spec, _read_bytes(spec.traffic_log))
    cache = Path(cache_dir)
    for sidecar_path in sorted(cache.glob(f"{spec.name}-*.json")):
        cached = _read_cached(sidecar_path, key)
        if cached is not None:
            return cached
    cal_set = build_set(spec)
    write_set(cal_set, cache)
    return cal_set
