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
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantgate.intake import chat_template, intake, regex_probes
from quantgate.quantize.engines.model_free import source_view
from quantgate.quantize.engines.stream_fp8 import plan
from quantgate.runtime.errors import (
    CheckpointConfigError,
    CheckpointError,
    CorruptSafetensorsError,
    IncompleteCheckpointError,
    MissingShardError,
    RemoteCodeError,
    SymlinkEscapeError,
)
from quantgate.runtime.progress import RichProgress
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


def edit_tokenizer(change: Callable[[dict], None]) -> Callable[[Path], None]:
    """``tokenizer.json`` parsed, changed by ``change`` and written back."""

    def make(ckpt: Path) -> None:
        data = json.loads((ckpt / "tokenizer.json").read_text())
        change(data)
        (ckpt / "tokenizer.json").write_text(json.dumps(data))

    return make


def split_regex(pattern: str) -> Callable[[Path], None]:
    """A pre-tokenizer ``Split`` on ``pattern`` before the tokenizer's own (ByteLevel)."""

    def change(data: dict) -> None:
        split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, data["pre_tokenizer"]]}

    return edit_tokenizer(change)


def token_id(token: str, new_id: int) -> Callable[[Path], None]:
    """The vocabulary's ``token`` given ``new_id``: the tokenizer emits it wherever ``token`` occurs."""
    return edit_tokenizer(lambda data: data["model"]["vocab"].update({token: new_id}))


def sized(rel: str, size: int) -> Callable[[Path], None]:
    """``rel`` made ``size`` bytes long (sparse: no bytes are written, only its size is read)."""

    def make(ckpt: Path) -> None:
        with open(ckpt / rel, "ab") as fh:
            fh.truncate(size)

    return make


def replace_text(rel: str, old: str, new: str) -> Callable[[Path], None]:
    def make(ckpt: Path) -> None:
        text = (ckpt / rel).read_text()
        assert old in text, f"{old!r} not in {rel}"
        (ckpt / rel).write_text(text.replace(old, new))

    return make


def index_omitting_half(ckpt: Path) -> None:
    """An index that names only the first half of the tensors its one shard holds."""
    names = sorted(load_file(ckpt / WEIGHTS))
    half = {name: WEIGHTS for name in names[: len(names) // 2]}
    (ckpt / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": half}))


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
    # chat templates that fail on ordinary messages (evaluation would crash on them), rendered in a
    # child under CPU and memory limits (the limits themselves: test_template_limits below)
    Case(
        "template-divides-by-zero",
        lambda c: (c / "chat_template.jinja").write_text("{% set n = messages|length - 3 %}{{ 1 / n }}"),
        CheckpointConfigError,
        ("chat_template.jinja", "cannot render an ordinary conversation", "ZeroDivisionError"),
    ),
    Case(
        "template-recurses",
        lambda c: (c / "chat_template.jinja").write_text(
            "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}"
        ),
        CheckpointConfigError,
        ("chat_template.jinja", "cannot render an ordinary conversation", "RecursionError"),
    ),
    Case(
        "template-undefined",
        template("{{ messages[0].content.nope.deeper }}"),
        CheckpointConfigError,
        ("tokenizer_config.json", "cannot render an ordinary conversation", "UndefinedError"),
    ),
    Case(
        "template-big-int",
        lambda c: (c / "chat_template.jinja").write_text("{{ 10 ** 100000000 }}"),
        CheckpointConfigError,
        ("chat_template.jinja", "did not finish rendering", "5 s of CPU time"),
    ),
    Case(
        "template-allocates-gigabytes",
        lambda c: (c / "chat_template.jinja").write_text("{{ (messages[0]['content'] * 120000000)|length }}"),
        CheckpointConfigError,
        ("chat_template.jinja", "needed more than 512 MiB"),
    ),
    Case(
        "template-nested-past-the-parser",
        lambda c: (c / "chat_template.jinja").write_text("{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}"),
        CheckpointConfigError,
        ("chat_template.jinja", "cannot render an ordinary conversation"),
    ),
    # tokenizer files: bounded, loadable, every id a row of the embedding
    Case(
        "tokenizer-backtracking-regex",
        split_regex(r"(\w+\s?)*$"),
        CheckpointConfigError,
        ("tokenizer.json", "pre_tokenizer regex", "retry-limit-in-match", "backtracks"),
    ),
    Case(
        "tokenizer-regex-does-not-compile",
        split_regex(r"[z-a]"),
        CheckpointConfigError,
        ("tokenizer.json", "does not compile"),
    ),
    Case(
        "tokenizer-json-too-large",
        sized("tokenizer.json", 110 * 1000**2),
        CheckpointConfigError,
        ("tokenizer.json", "110,000,000 bytes, over the 67,108,864-byte limit"),
    ),
    Case(
        "tokenizer-model-too-large",
        sized("tokenizer.model", 65 * 1024**2),
        CheckpointConfigError,
        ("tokenizer.model", "over the 67,108,864-byte limit"),
    ),
    Case(
        "tokenizer-vocab-larger-than-config",
        token_id("\u0120the", 700),  # byte-level " the"
        CheckpointConfigError,
        ("tokenizer.json", "token id 700 ('Ġthe')", "vocab_size is 512"),
    ),
    Case(
        "tokenizer-unigram-vocab-larger-than-config",
        edit_tokenizer(
            lambda data: data.update(
                model={"type": "Unigram", "unk_id": 0, "vocab": [[f"p{i}", -1.0] for i in range(600)]}
            )
        ),
        CheckpointConfigError,
        ("tokenizer.json", "token id 602 ('<|im_end|>')", "vocab_size is 512"),  # added tokens follow the 600
    ),
    Case(
        "tokenizer-eos-not-in-vocab",
        lambda c: edit_json(c / "tokenizer_config.json", eos_token="<|not-in-vocab|>"),
        CheckpointConfigError,
        ("tokenizer_config.json", "special token '<|not-in-vocab|>'", "not in tokenizer.json's vocabulary"),
    ),
    Case(
        "tokenizer-eos-id-past-the-embedding",
        lambda c: edit_json(c / "config.json", eos_token_id=100_000),
        CheckpointConfigError,
        ("config.json", "eos_token_id to 100000", "0 to 511"),
    ),
    Case(
        "tokenizer-eos-id-in-generation-config",
        lambda c: edit_json(c / "generation_config.json", eos_token_id=[2, 512]),
        CheckpointConfigError,
        ("generation_config.json", "eos_token_id to 512"),
    ),
    Case(
        "tokenizer-special-tokens-map-nested",
        lambda c: (c / "special_tokens_map.json").write_text('{"x": ' + nested(60_000) + "}"),
        CheckpointConfigError,
        ("special_tokens_map.json", "nested deeper"),
    ),
    Case(
        "tokenizer-json-nested",
        edit_tokenizer(lambda data: data.update(x=json.loads(nested(200)))),
        CheckpointConfigError,
        ("tokenizer.json", "nested 201 levels deep"),
    ),
    Case(
        "tokenizer-json-not-loadable",
        edit_tokenizer(lambda data: data["model"].update(type="NoSuchModel")),
        CheckpointConfigError,
        ("tokenizer.json", "cannot load"),
    ),
    # numbers that are not finite, in any JSON file
    Case(
        "numbers-nan-rope-theta",
        replace_text("config.json", '"rope_theta": 10000.0', '"rope_theta": NaN'),
        CheckpointConfigError,
        ("config.json", "holds the number nan, which is not finite"),
    ),
    Case(
        "numbers-overflowing-float",
        lambda c: append_raw(c / "config.json", "initializer_range", "1e999"),
        CheckpointConfigError,
        ("config.json", "holds the number inf, which is not finite"),
    ),
    Case(
        "numbers-infinity-in-generation-config",
        lambda c: append_raw(c / "generation_config.json", "temperature", "Infinity"),
        CheckpointConfigError,
        ("generation_config.json", "holds the number inf"),
    ),
    # an index must name every tensor its shards hold
    Case(
        "fileset-index-omits-tensors",
        index_omitting_half,
        MissingShardError,
        (INDEX, "omits tensor 'model.layers.0.self_attn.v_proj.weight'", "and 10 more", "uninitialised"),
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


@pytest.mark.parametrize(
    "text",
    [
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 10 ** 100000000 }}",  # one C call, while Jinja folds constants at compile time
        "{% set n = messages|length %}{{ 10 ** (n * 40000000) }}",  # one C call at render time
    ],
    ids=["python-loops", "big-int-at-compile-time", "big-int-at-render-time"],
)
def test_a_render_that_does_not_finish_is_refused(text, tiny_llama, refuse, monkeypatch):
    """Stopped by the kernel at the CPU limit (1 s here, 5 s by default), whatever the template runs."""
    monkeypatch.setattr(chat_template, "LIMITS", replace(chat_template.LIMITS, cpu_seconds=1))
    template(text)(tiny_llama)
    refuse(
        tiny_llama, CheckpointConfigError, "tokenizer_config.json", "did not finish rendering", "1 s of CPU"
    )


def test_the_render_is_killed_at_the_wall_clock_deadline(tiny_llama, refuse, monkeypatch):
    """A child that gets no CPU (here: it stops itself) is killed at the wall-clock deadline all the same."""
    monkeypatch.setattr(chat_template, "LIMITS", replace(chat_template.LIMITS, wall_seconds=1.0))
    monkeypatch.setattr(chat_template, "_verdict", lambda text, tokens: os.kill(os.getpid(), signal.SIGSTOP))
    refuse(tiny_llama, CheckpointConfigError, "chat_template.jinja", "did not finish rendering", "after 1 s")


RELEASED_REGEXES = {  # pre-tokenizer regexes of released tokenizers: none may be refused
    "llama-3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
    "o200k": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "deepseek-v3": r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "deepseek-v3-cjk": r"[一-龥぀-ゟ゠-ヿ]+",
    "bloom": r" ?[^(\s|[.,!?…。，、।۔،])]+",
    "gpt-2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}


@pytest.mark.parametrize("name", RELEASED_REGEXES)
def test_released_tokenizer_regexes_pass(name):
    assert regex_probes.check(RELEASED_REGEXES[name]) is None


def test_a_released_regex_passes_intake(tiny_llama, policy):
    """Control: a tokenizer.json with Llama-3's pre-tokenizer Split passes intake."""
    split_regex(RELEASED_REGEXES["llama-3"])(tiny_llama)
    assert intake(tiny_llama, policy).content_hash


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
    "template-big-int",
    "template-allocates-gigabytes",
    "tokenizer-backtracking-regex",
    "tokenizer-json-too-large",
    "tokenizer-vocab-larger-than-config",
    "tokenizer-special-tokens-map-nested",
    "numbers-nan-rope-theta",
    "fileset-index-omits-tensors",
]


@pytest.mark.heavy
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


@pytest.mark.heavy
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


# --- names are data: intake's messages carry the checkpoint's path as text, never as markup ------


def test_a_checkpoint_named_like_markup_is_taken_in(tiny_llama, tmp_path, policy, capsys, monkeypatch):
    """A directory named ``ck[/]`` crashed intake's log line in the terminal (Rich read ``[/]`` as a
    closing tag); the name reaches the terminal as it is."""
    monkeypatch.setenv("COLUMNS", "1000")  # one log line, unwrapped
    ckpt = Path(shutil.copytree(tiny_llama, tmp_path / "ck[" / "]"))
    with RichProgress() as progress:
        record = intake(ckpt, policy, progress)
    assert record.path == str(ckpt) and str(ckpt).endswith("ck[/]")
    assert f"intake: {ckpt}: LlamaForCausalLM" in capsys.readouterr().err
