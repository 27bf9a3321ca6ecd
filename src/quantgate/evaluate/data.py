"""Evaluation data: local files checked by sha256, or the same sets from the hub when online.

Build machines have no hub, so every public set is looked for first in a data directory
(``--data-dir``, ``$QUANTGATE_DATA``, else ``../shared/datasets`` beside the project), where the
file must match its recorded sha256: a silently different WikiText changes every perplexity.
When a file is absent and the hub is reachable (``HF_HUB_OFFLINE`` unset), the same split is
loaded with ``datasets``. A set that is nowhere is an error naming the file and every place
that was searched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from quantgate.config import expanded, path_setting
from quantgate.declarations import DataSource
from quantgate.runtime.atomic import write_text
from quantgate.runtime.errors import InputError
from quantgate.runtime.hashing import sha256_file


class MissingDataError(InputError):
    """An evaluation data set is neither in the data directory nor reachable on the hub."""


@dataclass(frozen=True)
class DataDir:
    """The directories searched, in order, for evaluation data files."""

    candidates: tuple[Path, ...]

    @classmethod
    def resolve(cls, explicit: Path | None, project_root: Path) -> DataDir:
        """``--data-dir``, then ``$QUANTGATE_DATA``, then ``../shared/datasets`` beside the project."""
        found: list[Path] = []
        if explicit:
            found.append(expanded(str(explicit), "--data-dir"))
        if env := path_setting("QUANTGATE_DATA"):
            found.append(env)
        found.append(project_root.parent / "shared" / "datasets")
        return cls(tuple(p.resolve() for p in found))

    def file(self, source: DataSource) -> Path | None:
        """The verified local file, or None when no candidate directory has it."""
        for base in self.candidates:
            path = base / source.local
            if path.is_file():
                if source.sha256 and (actual := sha256_file(path).sha256) != source.sha256:
                    raise MissingDataError(
                        path,
                        f"sha256 {actual[:16]}… differs from the expected {source.sha256[:16]}…",
                        "restore the original file (results on a different file are not comparable)",
                    )
                return path
        return None

    def require(self, source: DataSource) -> Path:
        """The verified local file; MissingDataError naming every directory searched."""
        path = self.file(source)
        if path is None:
            raise MissingDataError(
                source.local,
                "not found in " + ", ".join(str(c) for c in self.candidates),
                "pass --data-dir DIR (or set QUANTGATE_DATA) pointing at a directory that holds it",
            )
        return path


def sources(spec: BaseModel) -> list[DataSource]:
    """Every data file a suite spec names, however deeply its fields nest them."""
    found: list[DataSource] = []
    for name in type(spec).model_fields:
        value = getattr(spec, name)
        if isinstance(value, DataSource):
            found.append(value)
        elif isinstance(value, BaseModel):
            found += sources(value)
    return found


def require_available(data: DataDir, source: DataSource) -> None:
    """``source`` is here (verified) or the hub provides it now; MissingDataError otherwise.

    Why at planning: a set that is nowhere would otherwise fail each artifact's evaluation after
    every build has run (the source's reference may come from the cache and not need it).
    """
    if data.file(source) is None:
        _hub_rows(data, source)


def hub_online() -> bool:
    """Whether the hub may be asked (``HF_HUB_OFFLINE`` unset, empty, 0 or false)."""
    return os.environ.get("HF_HUB_OFFLINE", "0") in ("0", "", "false", "False")


def load_text(data: DataDir, source: DataSource) -> str:
    """A text corpus: the local file, else the hub split's ``text`` column joined by newlines."""
    path = data.file(source)
    if path is not None:
        return path.read_text(encoding="utf-8").replace("\r\n", "\n")  # stored upstream with CRLF
    return "".join(_hub_rows(data, source)["text"])


def load_jsonl_records(data: DataDir, source: DataSource) -> list[dict]:
    """JSONL records (GSM8K): the local file, else the hub split."""
    import json

    path = data.file(source)
    if path is not None:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [dict(r) for r in _hub_rows(data, source)]


def _hub_rows(data: DataDir, source: DataSource):
    """The hub split of a set that no data directory holds; MissingDataError (exit 2) naming every
    directory searched when the hub is off (``HF_HUB_OFFLINE``) or cannot provide it.

    Why not a transient error when the hub is unreachable: on a build machine without the hub
    a retry can never succeed; what fixes it is the data directory, which the message names.
    """
    if not (source.hub and hub_online()):
        data.require(source)  # raises, naming every place searched
    assert source.hub is not None
    from datasets import load_dataset

    try:
        return load_dataset(source.hub["path"], source.hub.get("name"), split=source.hub.get("split", "test"))
    except Exception as exc:  # whatever the hub client raises when it cannot answer
        reason = (str(exc).splitlines() or [""])[0][:200]
        raise MissingDataError(
            source.local,
            "not found in "
            + ", ".join(str(c) for c in data.candidates)
            + f", and the hub could not provide {source.hub['path']} ({type(exc).__name__}: {reason})",
            "pass --data-dir DIR (or set QUANTGATE_DATA) pointing at a directory that holds it; "
            "set HF_HUB_OFFLINE=1 where there is no hub",
        ) from exc


def jsonl_file(data: DataDir, source: DataSource, cache_dir: Path) -> Path:
    """A local JSONL path for loaders that need a file (lm-eval): the verified local file, or
    the hub split written once into the cache."""
    import json

    path = data.file(source)
    if path is not None:
        return path
    target = cache_dir / "hub" / source.local
    if not target.exists():
        records = load_jsonl_records(data, source)  # raises when the hub is not reachable either
        write_text(target, "".join(json.dumps(r) + "\n" for r in records))
    return target
