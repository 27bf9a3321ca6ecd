"""``intake``: the first boundary a checkpoint crosses, and the strictest.

Everything after intake trusts the source, so intake refuses anything unsafe or inconsistent
before a weight is quantized, each refusal its own error type naming the file, the problem and
the fix. The most dangerous problems come first and cheap checks before expensive ones: directory
entries (symlinks, pickles, code, names), config.json and chat templates, shard index and headers
(one file set: the weights transformers would load, and no other top-level weight file; an index
that names every tensor), source dtypes, the config's counts bounded by the tensors present (before
transformers computes with them), the tokenizer files (bounded, loadable, ids inside the
embedding), shapes and names against a meta-device skeleton (nothing missing, nothing extra), a NaN/Inf
scan, the content hash. Every JSON file is read within size, depth, integer and finiteness bounds;
chat templates and tokenizer.json are exercised in a child process under CPU and memory limits.
Intake writes nothing but its stat cache; its one ``intake:`` log line is how a run's logs show the
checkpoint was taken in once.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from quantgate.config import Gates
from quantgate.intake import architecture, bounds, chat_template, completeness, tokenizer_files, tree, weights
from quantgate.intake.record import SourceRecord
from quantgate.intake.safetensors_header import SafetensorsHeader
from quantgate.runtime.errors import (
    CheckpointConfigError,
    CheckpointError,
    EmptyCheckpointError,
    SymlinkEscapeError,
    TransientError,
)
from quantgate.runtime.hashing import FileEntry
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.stat_cache import StatCache


def intake(path: Path, policy: Gates, progress: Progress = SILENT, cache: Path | None = None) -> SourceRecord:
    """Validate, hash and classify the checkpoint directory at ``path``.

    With ``cache`` (a directory), files unchanged since an earlier intake (by stat) are neither
    scanned nor hashed again: ``stat_cache``. Raises a ``CheckpointError`` subclass (exit code 2)
    on the first problem found; a file that cannot be read is one too (``_read_errors``).
    """
    with _read_errors():
        return _intake(_resolved(path), policy, progress, cache)


def _intake(root: Path, policy: Gates, progress: Progress, cache: Path | None) -> SourceRecord:
    files = tree.list_files(root)
    tree.refuse_pickles(root, files)
    tree.refuse_code(root, files)
    if not any(rel.endswith(".safetensors") for rel in files):
        raise EmptyCheckpointError(
            root,
            "no .safetensors weights in the checkpoint directory" + ("" if files else " (it is empty)"),
            "point --checkpoint at a directory saved with save_pretrained (config.json + *.safetensors)",
        )

    if "config.json" not in files:
        raise CheckpointConfigError(
            root / "config.json", "config.json is missing", "save the model's config next to its weights"
        )
    raw = architecture.read_json(root / "config.json", "config.json")
    architecture.refuse_auto_map(root, files)
    chat_template.check(root, files)
    tokenizer_files.check_bounds(root, files)

    shards = weights.model_files(root, files)
    if not shards:
        raise EmptyCheckpointError(
            root,
            "no .safetensors weights at the top of the checkpoint directory (only in subdirectories)",
            "point --checkpoint at the directory that holds config.json and the model's *.safetensors",
        )
    headers = weights.read_headers(root, files)
    tensors = weights.collect_tensors(root, files, shards, headers)
    if not tensors:
        raise EmptyCheckpointError(
            root,
            "the checkpoint's safetensors files hold no tensors",
            "re-save the model with save_pretrained",
        )
    weights.check_source_dtypes(root, tensors)
    # counts bounded by the tensors present before transformers sees the config: its config
    # classes compute with them and the skeleton is built from them (bounds.py)
    bounds.check(root, raw, tensors)
    config = architecture.load_config(root, raw)
    vocab_size = getattr(architecture.text_config(config), "vocab_size", None)
    tokenizer_files.check(root, files, vocab_size if isinstance(vocab_size, int) else None)
    experts = architecture.num_experts(config)
    model = architecture.skeleton(root, config)
    loaded = completeness.memory_names(model, tensors)
    architecture.check_shapes(root, config, model, tensors, loaded)
    architecture.check_expert_count(root, tensors, experts)
    completeness.check_complete(root, model, tensors, loaded)
    del model
    seen = StatCache(cache, root, files)
    entries, content_hash = _scan_and_hash(root, files, tensors, headers, progress, seen)
    seen.save(entries)

    text = architecture.text_config(config)
    params = weights.count_params(tensors)
    context = getattr(text, "max_position_embeddings", None)
    context = context if isinstance(context, int) and not isinstance(context, bool) else None
    moe = experts is not None
    record = SourceRecord(
        path=str(root),
        content_hash=content_hash,
        files=entries,
        architecture=raw["architectures"][0],
        model_type=raw["model_type"],
        params=params,
        moe=moe,
        num_experts=experts,
        dtype=weights.dominant_dtype(tensors),
        bytes=sum(e.bytes for e in entries.values()),
        context_length=context,
        model_class=policy.classify(moe=moe, params=params, context=context),
        weight_files=shards,
        tie_word_embeddings=bool(
            getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False))
        ),
    )
    progress.log(
        f"intake: {root}: {record.architecture}, {params / 1e6:.1f} M params, {'MoE' if moe else 'dense'}, "
        f"class {record.model_class}, content hash {content_hash[:12]} "
        f"({len(files) - len(seen.known)} of {len(files)} files hashed)"
    )
    return record


def _scan_and_hash(
    root: Path,
    files: list[str],
    tensors: weights.Tensors,
    headers: dict[str, SafetensorsHeader],
    progress: Progress,
    seen: StatCache,
) -> tuple[dict[str, FileEntry], str]:
    """The NaN/Inf scan and the content hash, side by side: each reads every weight byte, and
    together they read the checkpoint once from disk (the one ahead pulls a block into the page
    cache, the other finds it there) in the time of the slower. An 8B checkpoint in one file took
    9 s to scan and then 14 s to hash on an H200 worker. A non-finite tensor is still refused
    first, and stops the hashing."""
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="intake-hash") as pool:
        hashed = pool.submit(tree.hash_files, root, files, progress, seen.known, stop)
        try:
            weights.scan_finite(root, tensors, headers, progress, skip=set(seen.known))
        except BaseException:
            stop.set()
            raise
        return hashed.result()


def confirm(record: SourceRecord, progress: Progress = SILENT, cache: Path | None = None) -> SourceRecord:
    """``record`` when its checkpoint still holds exactly the files it describes, else CheckpointError.

    For a step handed an intake record (a run's plan) instead of a checkpoint to take in: every
    check of intake holds for the same bytes, so only the bytes are confirmed, by a stat per file
    that intake's stat cache knows and a hash of each file it does not.
    """
    with _read_errors():
        return _confirm(record, progress, cache)


def _confirm(record: SourceRecord, progress: Progress, cache: Path | None) -> SourceRecord:
    root = Path(record.path)
    files = tree.list_files(root)
    fix = (
        "plan again (run the flow again, or the command without --plan): the checkpoint changed since intake"
    )
    for rel in sorted(set(files) ^ set(record.files)):
        problem = "is new" if rel in set(files) else "is missing"
        raise CheckpointError(root / rel, f"{problem} since the checkpoint's intake", fix)
    seen = StatCache(cache, root, files)
    # the record's own scheme: a record written before the merkle scheme still confirms
    scheme = next(iter(record.files.values())).scheme if record.files else "sha256"
    entries, _ = tree.hash_files(root, files, progress, known=seen.known, scheme=scheme)
    for rel in files:
        if entries[rel] != record.files[rel]:
            raise CheckpointError(root / rel, f"differs from the file intake hashed ({scheme} differs)", fix)
    seen.save(entries)
    return record


# a file the checkpoint's owner made unreadable, or a path that cannot be followed: the input's
# fault (exit 2); any other read failure (EIO, a network filesystem's timeout) may pass on retry
_INPUT_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG}
)


@contextmanager
def _read_errors() -> Iterator[None]:
    """A file intake cannot read becomes a one-line error naming it, never a traceback."""
    try:
        yield
    except OSError as exc:
        where = tree.shown(exc.filename) if exc.filename else None
        if exc.errno in _INPUT_ERRNOS:
            raise CheckpointError(
                where,
                f"cannot read this checkpoint file ({exc.strerror})",
                "make it readable by the user quantgate runs as, or remove it from the checkpoint",
            ) from None
        raise TransientError(f"{where}: reading the checkpoint failed ({exc.strerror}); retry") from None


def _resolved(path: Path) -> Path:
    """The checkpoint directory as an absolute path with symlinks resolved."""
    try:
        return Path(path).expanduser().resolve()
    except RuntimeError:  # Python 3.11: a symlink loop (later versions raise OSError: ELOOP)
        raise SymlinkEscapeError(
            path, "the checkpoint path is a symlink loop", "pass the directory itself"
        ) from None
