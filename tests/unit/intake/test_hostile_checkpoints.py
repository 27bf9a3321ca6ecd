"""The hostile-input suite: checkpoints built to hurt intake, each refused with exit 2 and a
one-line message naming the file, the checkpoint left as it was (the ``refuse`` fixture).

Every case is hand-written here from a fresh tiny checkpoint. Before these fixes the same inputs
shipped NaN weights with exit 0 (a weight file its index does not name), ran until killed (a
million layers), or ended in a traceback with exit 1 (deep JSON, 5,000-digit integers, zero
heads, symlink loops, names that are not UTF-8, unreadable files, a directory named
``*.safetensors``, int8 or FP8 source weights, a chat template the Jinja sandbox stops, remote
code in ``text_config``). A few cases run through the command line as a user would, to show
the exit code, the one-line message and that nothing is written.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantgate.errors import (
    CheckpointConfigError,
    CheckpointError,
    CorruptSafetensorsError,
    IncompleteCheckpointError,
    MissingShardError,
    RemoteCodeError,
    SymlinkEscapeError,
)
from quantgate.intake import chat_template, intake
from quantgate.quantize.engines.model_free import source_view
from quantgate.quantize.engines.stream_fp8 import plan
from support.cli import quantgate

pytestmark = pytest.mark.unit

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


# --- how each hostile checkpoint is made (from a fresh tiny Llama, or a tiny Mixtral) ----------


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def append_raw(path: Path, key: str, raw: str) -> None:
    """Add ``"key": <raw JSON text>`` to a JSON object file, written as text (json.dumps could not)."""
    text = path.read_text().rstrip()
    path.write_text(f'{text[:-1]}, "{key}": {raw}}}')


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def rewrite_header(path: Path, raw_header: str) -> None:
    """Replace the safetensors header of ``path`` by ``raw_header`` (the data section kept)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    new = raw_header.encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n :])


def header_with(path: Path, key: str, raw: str) -> None:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    text = data[8 : 8 + n].decode().rstrip()
    rewrite_header(path, f'{text[:-1]}, "{key}": {raw}}}')


def write_index(ckpt: Path, shard_of: Callable[[str], str] = lambda name: WEIGHTS) -> None:
    names = load_file(ckpt / WEIGHTS)
    (ckpt / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {n: shard_of(n) for n in names}}))


def unindexed_nan_copy(ckpt: Path) -> None:
    """The issue's case: indexed shards are clean; a copy the index does not name holds NaN."""
    write_index(ckpt)
    tensors = load_file(ckpt / WEIGHTS)
    tensors["model.layers.0.mlp.down_proj.weight"][:] = float("nan")
    save_file(tensors, ckpt / "model_nan.safetensors", metadata={"format": "pt"})


def weights_as(dtype: torch.dtype) -> Callable[[Path], None]:
    def make(ckpt: Path) -> None:
        tensors = load_file(ckpt / WEIGHTS)
        tensors = {k: v.to(dtype) if k.endswith("proj.weight") else v for k, v in tensors.items()}
        save_file(tensors, ckpt / WEIGHTS, metadata={"format": "pt"})

    return make


def template(value) -> Callable[[Path], None]:
    """``tokenizer_config.json``'s chat_template set to ``value`` (the .jinja file removed: it would win)."""

    def make(ckpt: Path) -> None:
        (ckpt / "chat_template.jinja").unlink(missing_ok=True)
        edit_json(ckpt / "tokenizer_config.json", chat_template=value)

    return make


def symlink(name: str, to: str) -> Callable[[Path], None]:
    return lambda ckpt: os.symlink(to, ckpt / name)


def loop(ckpt: Path) -> None:
    os.symlink("loop_b", ckpt / "loop_a")
    os.symlink("loop_a", ckpt / "loop_b")


def non_utf8_name(ckpt: Path) -> None:
    with open(os.path.join(os.fsencode(ckpt), b"notes-\xff.txt"), "wb") as fh:
        fh.write(b"x")


@dataclass(frozen=True)
class Case:
    id: str  # category-case
    make: Callable[[Path], None]
    error: type[CheckpointError]
    names: tuple[str, ...]
    model: str = "llama"


CASES = [
    # one file set per checkpoint: what intake validates is what every engine reads
    Case(
        "fileset-unindexed-nan-copy",
        unindexed_nan_copy,
        IncompleteCheckpointError,
        ("model_nan.safetensors", "not named by model.safetensors.index.json"),
    ),
    Case(
        "fileset-second-index",
        lambda c: (write_index(c), shutil.copy(c / INDEX, c / "other.safetensors.index.json")),
        MissingShardError,
        ("other.safetensors.index.json", "not the one transformers reads"),
    ),
    Case(
        "fileset-two-files-no-index",
        lambda c: shutil.copy(c / WEIGHTS, c / "model-copy.safetensors"),
        IncompleteCheckpointError,
        ("2 weight files", "no model.safetensors.index.json"),
    ),
    Case(
        "fileset-misnamed-single-file",
        lambda c: (c / WEIGHTS).rename(c / "weights.safetensors"),
        IncompleteCheckpointError,
        ("weights.safetensors", "loads only model.safetensors"),
    ),
    # resource bounds, checked before any model is built
    Case(
        "bounds-million-layers",
        lambda c: edit_json(c / "config.json", num_hidden_layers=1_000_000),
        CheckpointConfigError,
        ("config.json", "num_hidden_layers = 1,000,000", "more layers than the checkpoint stores tensors"),
    ),
    Case(
        "bounds-million-layers-in-text-config",
        lambda c: edit_json(c / "config.json", text_config={"num_hidden_layers": 1_000_000}),
        CheckpointConfigError,
        ("text_config.num_hidden_layers = 1,000,000",),
    ),
    Case(
        "bounds-zero-heads",
        lambda c: edit_json(c / "config.json", num_attention_heads=0),
        CheckpointConfigError,
        ("num_attention_heads = 0", "not a positive integer"),
    ),
    Case(
        "bounds-zero-kv-heads",
        lambda c: edit_json(c / "config.json", num_key_value_heads=0),
        CheckpointConfigError,
        ("num_key_value_heads = 0",),
    ),
    Case(
        "bounds-heads-wider-than-any-tensor",
        lambda c: edit_json(c / "config.json", num_attention_heads=10**9),
        CheckpointConfigError,
        ("num_attention_heads = 1,000,000,000", "widest tensor dimension"),
    ),
    Case(
        "bounds-layers-not-an-integer",
        lambda c: edit_json(c / "config.json", num_hidden_layers="2"),
        CheckpointConfigError,
        ("num_hidden_layers = '2'",),
    ),
    Case(
        "bounds-million-experts",
        lambda c: edit_json(c / "config.json", num_local_experts=1_000_000),
        CheckpointConfigError,
        ("num_local_experts = 1,000,000 experts",),
        model="mixtral",
    ),
    # JSON that Python's parser cannot take, or should not
    Case(
        "json-nesting-config",
        lambda c: append_raw(c / "config.json", "x", nested(100_000)),
        CheckpointConfigError,
        ("config.json", "nested deeper"),
    ),
    Case(
        "json-nesting-config-within-parser",
        lambda c: append_raw(c / "config.json", "x", nested(500)),
        CheckpointConfigError,
        ("config.json", "nested 501 levels deep"),
    ),
    Case(
        "json-nesting-tokenizer-config",
        lambda c: append_raw(c / "tokenizer_config.json", "x", nested(100_000)),
        CheckpointConfigError,
        ("tokenizer_config.json", "nested deeper"),
    ),
    Case(
        "json-nesting-index",
        lambda c: (write_index(c), append_raw(c / INDEX, "x", nested(100_000))),
        MissingShardError,
        (INDEX, "nested deeper"),
    ),
    Case(
        "json-nesting-header",
        lambda c: header_with(c / WEIGHTS, "x", nested(100_000)),
        CorruptSafetensorsError,
        (WEIGHTS, "header nested deeper"),
    ),
    Case(
        "json-bigint-config",
        lambda c: append_raw(c / "config.json", "x", "9" * 5000),
        CheckpointConfigError,
        ("config.json", "integer of 5,000 digits"),
    ),
    Case(
        "json-bigint-header",
        lambda c: header_with(c / WEIGHTS, "x", "9" * 5000),
        CorruptSafetensorsError,
        (WEIGHTS, "integer of 5,000 digits"),
    ),
    Case(
        "json-bigint-index",
        lambda c: (write_index(c), append_raw(c / INDEX, "x", "9" * 5000)),
        MissingShardError,
        (INDEX, "integer of 5,000 digits"),
    ),
    Case(
        "json-config-too-large",
        lambda c: append_raw(c / "config.json", "padding", json.dumps("x" * 1024**2)),
        CheckpointConfigError,
        ("config.json", "over the 1,048,576-byte limit"),
    ),
    # the directory tree
    Case("tree-symlink-loop", loop, SymlinkEscapeError, ("loop_", "symlink loop")),
    Case(
        "tree-symlink-to-itself", symlink("self.json", "self.json"), SymlinkEscapeError, ("self.json", "loop")
    ),
    Case("tree-non-utf8-name", non_utf8_name, CheckpointError, ("notes-\\xff.txt", "not valid UTF-8")),
    Case(
        "tree-directory-named-safetensors",
        lambda c: (c / "extra.safetensors").mkdir(),
        CheckpointError,
        ("extra.safetensors", "directory named like a .safetensors file"),
    ),
    Case(
        "tree-directory-named-json",
        lambda c: (c / "sub" / "config.json").mkdir(parents=True),
        CheckpointError,
        ("sub/config.json", "directory named like a .json file"),
    ),
    # already-quantized sources: refused before an output directory exists
    Case("dtype-int8-source", weights_as(torch.int8), CheckpointError, (WEIGHTS, "stored as int8")),
    Case(
        "dtype-fp8-source",
        weights_as(torch.float8_e4m3fn),
        CheckpointError,
        (WEIGHTS, "stored as float8_e4m3fn"),
    ),
    Case("dtype-f64-source", weights_as(torch.float64), CheckpointError, (WEIGHTS, "stored as float64")),
    # chat templates: what transformers' Jinja sandbox would stop at render time
    Case(
        "template-python-internals",
        template("{{ ''.__class__.__mro__[1].__subclasses__() }}"),
        CheckpointConfigError,
        ("tokenizer_config.json", "Jinja sandbox refuses"),
    ),
    Case(
        "template-internals-in-an-unreached-branch",
        template("{% if messages|length > 99 %}{{ cycler.__init__.__globals__ }}{% endif %}hi"),
        CheckpointConfigError,
        ("tokenizer_config.json", "'__globals__'"),
    ),
    Case(
        "template-attr-filter",
        template("{{ messages|attr('__class__') }}"),
        CheckpointConfigError,
        ("tokenizer_config.json", "'__class__'"),
    ),
    Case(
        "template-refused-at-render",
        template("{{ messages.pop() }}"),
        CheckpointConfigError,
        ("tokenizer_config.json", "refused by the Jinja sandbox"),
    ),
    Case(
        "template-syntax-error",
        template("{% for m in messages %}{{ m.content }}"),
        CheckpointConfigError,
        ("tokenizer_config.json", "not valid Jinja"),
    ),
    Case(
        "template-named-list",
        template(
            [{"name": "default", "template": "hi"}, {"name": "tool_use", "template": "{{ x.__class__ }}"}]
        ),
        CheckpointConfigError,
        ("chat template 'tool_use' in tokenizer_config.json",),
    ),
    Case(
        "template-jinja-file",
        lambda c: (c / "chat_template.jinja").write_text("{{ ''.__class__ }}"),
        CheckpointConfigError,
        ("chat_template.jinja", "'__class__'"),
    ),
    Case(
        "template-not-a-string",
        template({"default": 3}),
        CheckpointConfigError,
        ("tokenizer_config.json", "neither a string nor a list"),
    ),
    # remote code
    Case(
        "remote-code-auto-map-in-text-config",
        lambda c: edit_json(c / "config.json", text_config={"auto_map": {"AutoModelForCausalLM": "x.Y"}}),
        RemoteCodeError,
        ("config.json", "'auto_map' in text_config", "remote code"),
    ),
    Case(
        "remote-code-auto-map-in-tokenizer-config",
        lambda c: edit_json(
            c / "tokenizer_config.json", extra={"deep": {"auto_map": {"AutoTokenizer": "t.T"}}}
        ),
        RemoteCodeError,
        ("tokenizer_config.json", "'auto_map' in extra.deep"),
    ),
]


@pytest.fixture
def checkpoint(tiny_llama, tiny_mixtral) -> Callable[[str], Path]:
    return lambda model: {"llama": tiny_llama, "mixtral": tiny_mixtral}[model]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_checkpoint_is_refused(case, checkpoint, refuse):
    ckpt = checkpoint(case.model)
    case.make(ckpt)
    refuse(ckpt, case.error, *case.names)


def test_a_render_that_does_not_finish_is_refused(tiny_llama, refuse, monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.5)
    template("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}")(tiny_llama)
    refuse(tiny_llama, CheckpointConfigError, "tokenizer_config.json", "did not finish rendering")


@pytest.mark.parametrize(
    "text",
    [
        "{{ raise_exception('only user and assistant roles') }}",  # declines the sample: not unsafe
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}",
        "{{ bos_token }}{% for m in messages %}{{ m.content|trim }}{% endfor %}",
    ],
    ids=["declines-the-sample", "generation-tag", "special-tokens"],
)
def test_ordinary_chat_templates_pass(tiny_llama, policy, text):
    template(text)(tiny_llama)
    assert intake(tiny_llama, policy).content_hash


def test_weight_files_in_subdirectories_are_recorded_but_never_read(tiny_llama, policy):
    """One file set: a NaN weight file under original/ is not the model, so no engine may read it
    (model_free_ptq walks the whole tree; it is given a view of intake's files instead)."""
    (tiny_llama / "original").mkdir()
    tensors = load_file(tiny_llama / WEIGHTS)
    tensors["model.norm.weight"][:] = float("nan")
    save_file(tensors, tiny_llama / "original" / "consolidated.safetensors")
    record = intake(tiny_llama, policy)
    assert record.weight_files == [WEIGHTS]
    assert "original/consolidated.safetensors" in record.files
    headers, _, _ = plan(tiny_llama, [], record.weight_files)
    assert list(headers) == [WEIGHTS]
    with source_view(record) as view:
        seen = sorted(p.relative_to(view).as_posix() for p in view.rglob("*") if not p.is_dir())
    assert seen == sorted(rel for rel in record.files if rel != "original/consolidated.safetensors")


# --- through the command line, as CI and a release engineer run it -------------------------


CLI_CASES = [
    "fileset-unindexed-nan-copy",
    "bounds-million-layers",
    "json-nesting-header",
    "dtype-int8-source",
]


@pytest.mark.parametrize("case_id", CLI_CASES)
def test_command_line_exits_2_and_writes_nothing(case_id, tiny_llama, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    case.make(tiny_llama)
    out = tmp_path / "out"
    result = quantgate("build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(out))
    assert result.returncode == 2, result.stderr[-2000:]
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and all(name in error[0] for name in case.names), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not out.exists(), "a refused checkpoint left an output directory"


# --- unreadable files: root reads everything, so the test drops root's file-access override ---


def _without_dac_override() -> None:
    """In the child, before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set,
    so the exec'd root process obeys file modes like any owner (its other rights are kept)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize("rel", ["config.json", "tokenizer_config.json", WEIGHTS, "chat_template.jinja"])
def test_unreadable_file_is_refused_naming_it(rel, tiny_llama, tmp_path):
    (tiny_llama / rel).chmod(0)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "quantgate.cli", "build", "--checkpoint", str(tiny_llama), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        preexec_fn=_without_dac_override if os.geteuid() == 0 else None,  # not root: the mode is enough
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"error: {tiny_llama / rel}: cannot read this checkpoint file (Permission denied)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
