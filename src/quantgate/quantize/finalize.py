"""What every artifact gets after its engine ran: the source's non-weight files, readable by anyone.

The gate measured the source's tokenizer, chat template and generation settings; the fleet must
serve the same. Engines re-save them (llm-compressor's ``tokenizer.save_pretrained`` wrote the
calibration's 512-token truncation into ``tokenizer.json``), so the source's files are copied over
whatever an engine wrote and then verified by sha256; the manifest records them (``source_files``)
and ``quantgate pull`` checks them again. ``config.json`` is the engine's (it carries the
quantization config), but keys of the source's config that the engine dropped come back: a
transformers 5 save keeps the RoPE base only in ``rope_parameters``, and a stack on transformers 4
would read the default ``rope_theta`` instead. Every JSON and YAML file must load with a safe
loader (llm-compressor's ``recipe.yaml`` carries ``!!python/object`` tags for enums; it is kept, as
the record of every default the modifier applied, but rewritten as plain data). Files are 0644 and
directories 0755, so a server that does not run as the builder's user can read a copy. Expert
tensors get the source's per-expert names back (``expert_names``: llm-compressor's MoE
linearization saves Mixtral's ``w1``/``w3``/``w2`` as ``gate_proj``/``up_proj``/``down_proj``, which
vLLM's Mixtral loader does not match).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from quantgate.contracts.artifact import SUPPORT_FILES
from quantgate.quantize import expert_names
from quantgate.runtime.errors import BuildError
from quantgate.runtime.hashing import sha256_file

CONFIG = "config.json"
# the engine's own: what it quantized and how (never the source's, should the source have one)
QUANTIZATION_KEYS = frozenset({"quantization_config", "compression_config"})
FILE_MODE, DIR_MODE = 0o644, 0o755


def finish(source: Path, out_dir: Path) -> dict[str, str]:
    """Everything below, in order, for a freshly built ``out_dir``; returns ``source_files``."""
    restore_config_keys(source, out_dir)
    expert_names.restore(source, out_dir)
    plain_yaml(out_dir)
    source_files = restore_support_files(source, out_dir)
    check_safe_loading(out_dir)
    return source_files


def restore_support_files(source: Path, out_dir: Path) -> dict[str, str]:
    """Copy the source's support files over the engine's and drop any the source lacks.

    Returns ``{name: sha256}`` of the source's files, once each copy is verified equal.
    """
    for name in SUPPORT_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out_dir / name)
        elif (out_dir / name).exists():  # written by the engine, not the source's: not served
            (out_dir / name).unlink()
    return verify_support_files(source, out_dir)


def verify_support_files(source: Path, out_dir: Path) -> dict[str, str]:
    """``{name: sha256}`` of the source's support files; BuildError unless ``out_dir`` holds them
    byte for byte, and no support file the source lacks."""
    found: dict[str, str] = {}
    for name in SUPPORT_FILES:
        if not (source / name).is_file():
            if (out_dir / name).exists():
                raise BuildError(f"{out_dir / name}: the source has no {name}, the artifact must not either")
            continue
        want = sha256_file(source / name).sha256
        got = sha256_file(out_dir / name).sha256 if (out_dir / name).is_file() else None
        if got != want:
            raise BuildError(
                f"{out_dir / name}: differs from the source's {name} (sha256 {got} != {want}); "
                "non-weight files must be the source's"
            )
        found[name] = want
    return found


def restore_config_keys(source: Path, out_dir: Path) -> list[str]:
    """Put back into ``out_dir/config.json`` the source's keys the engine dropped (not quantization's).

    Nested objects present in both are restored key by key. The file is rewritten only when a
    key came back, as transformers writes it (indent 2, sorted keys). Returns the restored keys.
    """
    if not (source / CONFIG).is_file() or not (out_dir / CONFIG).is_file():
        return []
    theirs = json.loads((source / CONFIG).read_text(encoding="utf-8"))
    ours = json.loads((out_dir / CONFIG).read_text(encoding="utf-8"))
    restored = _restore(theirs, ours, "", skip=QUANTIZATION_KEYS)
    if restored:
        (out_dir / CONFIG).write_text(json.dumps(ours, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return restored


def _restore(theirs: dict[str, Any], ours: dict[str, Any], where: str, skip: frozenset[str]) -> list[str]:
    restored = []
    for key, value in theirs.items():
        if key in skip:
            continue
        if key not in ours:
            ours[key] = value
            restored.append(where + key)
        elif isinstance(value, dict) and isinstance(ours[key], dict):
            restored += _restore(value, ours[key], f"{where}{key}.", skip)
    return restored


class _PlainLoader(yaml.SafeLoader):
    """A safe loader that reads ``!!python/...`` tags as the plain data they wrap, constructing
    nothing: ``!!python/object/apply:module.Enum [value]`` is ``value``, an object its state."""


def _plain(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        return suffix.split(":", 1)[1] if suffix.startswith("name:") and not value else value
    if isinstance(node, yaml.SequenceNode):
        items = loader.construct_sequence(node, deep=True)
        return items[0] if suffix.startswith("object/apply:") and len(items) == 1 else items
    if isinstance(node, yaml.MappingNode):
        mapping = loader.construct_mapping(node, deep=True)
        # the long form of apply/new: {args: [...], state: {...}}
        args = (
            mapping.get("args")
            if set(mapping) <= {"args", "kwds", "state", "listitems", "dictitems"}
            else None
        )
        if isinstance(args, list) and len(args) == 1:
            return args[0]
        return mapping.get("state", mapping)
    raise yaml.constructor.ConstructorError(
        None, None, f"unexpected node for !!python/{suffix}", node.start_mark
    )


_PlainLoader.add_multi_constructor("tag:yaml.org,2002:python/", _plain)


def plain_yaml(out_dir: Path) -> list[str]:
    """Rewrite every YAML file that a safe loader refuses as the plain data it holds; returns them."""
    rewritten = []
    for path in sorted(_files(out_dir, (".yaml", ".yml"))):
        text = path.read_text(encoding="utf-8")
        try:
            yaml.safe_load(text)
        except yaml.YAMLError:
            data = yaml.load(text, Loader=_PlainLoader)  # a SafeLoader subclass: constructs no object
            path.write_text(
                yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=88, allow_unicode=True),
                encoding="utf-8",
            )
            rewritten.append(path.relative_to(out_dir).as_posix())
    return rewritten


def check_safe_loading(out_dir: Path) -> None:
    """BuildError naming the first JSON or YAML file that ``json.loads``/``yaml.safe_load`` refuse."""
    for path in sorted(_files(out_dir, (".json", ".yaml", ".yml"))):
        try:
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".json":
                json.loads(text)
            else:
                yaml.safe_load(text)
        except (UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
            raise BuildError(f"{path}: does not load with a safe loader ({exc})") from None


def set_modes(directory: Path) -> None:
    """Files 0644, directories 0755 (``directory`` too): any user on a serving node may read a copy."""
    os.chmod(directory, DIR_MODE)
    for root, dirs, files in os.walk(directory):  # links are not followed (nor chmod-ed)
        for names, mode in ((dirs, DIR_MODE), (files, FILE_MODE)):
            for name in names:
                path = os.path.join(root, name)
                if not os.path.islink(path):
                    os.chmod(path, mode)


def _files(directory: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and p.suffix in suffixes]
