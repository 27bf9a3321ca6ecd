"""How much of an artifact's divergence from the source each layer group causes.

Measured directly, not through a proxy: the uniform artifact is loaded in its target's numerics
(``load_for_eval``), and for each group the source's own modules are swapped in for that group
alone; the group's sensitivity is how far the mean KL divergence from the source, over the
calibration texts, falls when it is restored. That is exactly the question repair asks ("what
does keeping this group one step up buy?"), with the other groups' errors present, so effects
that compound through later layers are counted. One forward pass per group: 121 passes of two
128-token windows for the default model (emulated NVFP4 activations cost about 1.7 s per 128 tokens
on 2 CPU cores, so the windows are few; every group is measured on the same tokens, so the ranking
compares like with like). A group in decoder layer L changes nothing before L, so its pass replays
the uniform pass's outputs of layers 0..L-1 and computes only L onwards (``_replayed``): the same
numbers (a test checks them against full passes) for about half the work.

Restoring to the source's bf16 rather than to the upgrade's own format (FP8 under NVFP4) ranks
the groups by the error of the target's format; the upgrade's own error is an order of magnitude
smaller and is measured where it matters, when each variant is evaluated.

Cached by content: the source hash, the artifact's build key and the texts' hash (a rebuilt
artifact or another calibration set measures again).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantgate.contracts.artifact import require_manifest
from quantgate.numerics import (
    RoutedExperts,
    disk_to_memory,
    expert_key,
    load_for_eval,
    load_source_for_eval,
)
from quantgate.repair.units import Unit
from quantgate.runtime.atomic import write_json
from quantgate.runtime.frozen import FrozenRecord
from quantgate.runtime.progress import SILENT, Progress

METHOD = "restore-one-kld-v1"  # part of the cache key: a change of method measures again
WINDOWS = 2
WINDOW_TOKENS = 128


class Sensitivity(FrozenRecord):
    """Per layer group: how much the mean KLD to the source falls when that group alone is restored."""

    method: str
    source_hash: str
    build_key: str
    texts_sha256: str
    tokens: int
    kld_uniform: float  # mean KLD of the uniform artifact on the same tokens
    scores: dict[str, float]  # group -> KLD reduction when restored
    seconds: float

    def ranked(self, units: list[Unit]) -> list[Unit]:
        """``units`` most sensitive first (ties in checkpoint order)."""
        order = {u.name: i for i, u in enumerate(units)}
        return sorted(units, key=lambda u: (-self.scores[u.name], order[u.name]))


def texts_sha256(texts: list[str]) -> str:
    """The texts' identity for the cache key."""
    return hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def measure(
    artifact_dir: Path,
    source_dir: Path,
    source_hash: str,
    units: list[Unit],
    texts: list[str],
    cache_dir: Path | None,
    progress: Progress = SILENT,
    *,
    replay: bool = True,
    device: str = "cpu",
) -> Sensitivity:
    """Each group's sensitivity (cached under ``cache_dir/repair/`` when given), both models on
    ``device`` (a GPU's scores have their own cache key; the CPU's keys are unchanged)."""
    build_key = require_manifest(Path(artifact_dir)).build_key
    digest = texts_sha256(texts)
    where = "" if device == "cpu" else f":{device}"
    key = hashlib.sha256(f"{METHOD}:{source_hash}:{build_key}:{digest}{where}".encode()).hexdigest()
    cached = Path(cache_dir) / "repair" / f"sensitivity-{key[:32]}.json" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        found = Sensitivity.model_validate_json(cached.read_text())
        if set(found.scores) == {u.name for u in units}:
            progress.log(f"sensitivity of {len(units)} layer groups: cached ({cached})")
            return found
    started = time.perf_counter()
    artifact = load_for_eval(Path(artifact_dir), device=device)
    source = load_source_for_eval(Path(source_dir), device=device)
    ids = _windows(artifact.tokenizer, texts).to(device)
    with torch.inference_mode():
        reference = torch.log_softmax(source.model(ids, use_cache=False).logits.float(), dim=-1)
        kld_uniform = _kld(reference, artifact.model(ids, use_cache=False).logits)
        scores = _scores(artifact.model, source.model, units, ids, reference, kld_uniform, progress, replay)
    result = Sensitivity(
        method=METHOD,
        source_hash=source_hash,
        build_key=build_key,
        texts_sha256=digest,
        tokens=int(ids.numel()),
        kld_uniform=kld_uniform,
        scores=scores,
        seconds=round(time.perf_counter() - started, 1),
    )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_json(cached, result.model_dump(mode="json"))
    return result


def _scores(
    artifact: nn.Module,
    source: nn.Module,
    units: list[Unit],
    ids: torch.Tensor,
    reference: torch.Tensor,
    kld_uniform: float,
    progress: Progress,
    replay: bool,
) -> dict[str, float]:
    """Each group's fall in KLD when it alone is restored; ``replay``: layers before it replayed."""
    layers = _decoder_layers(artifact) if replay else None
    outputs: list[Any] = []
    if layers is not None:  # the uniform pass's output of every decoder layer, to replay
        hooks = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for layer in layers]
        try:
            artifact(ids, use_cache=False)
        finally:
            for hook in hooks:
                hook.remove()
    scores = {}
    with progress.task(f"sensitivity of {len(units)} layer groups", total=len(units)) as task:
        for unit in units:
            first = _layer_index(unit) if layers is not None else None
            with _restored(artifact, source, unit), _replayed(layers, outputs, first or 0):
                scores[unit.name] = kld_uniform - _kld(reference, artifact(ids, use_cache=False).logits)
            task.advance()
    return scores


def _decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The decoder's layer list, where the model has the usual one."""
    try:
        layers = model.get_decoder().layers  # type: ignore[operator]
    except AttributeError:
        return None
    return layers if isinstance(layers, nn.ModuleList) else None


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _layer_index(unit: Unit) -> int | None:
    """The decoder layer all of ``unit``'s modules sit in (None: not one layer's)."""
    found = {m.group(1) for m in (_LAYER.search(name) for name in unit.modules) if m}
    return int(found.pop()) if len(found) == 1 and all(_LAYER.search(n) for n in unit.modules) else None


class _Replay(nn.Module):
    """Stands in for a decoder layer: returns what that layer returned in the uniform pass."""

    def __init__(self, original: nn.Module, output: Any) -> None:
        super().__init__()
        self.output = output
        self.attention_type = getattr(original, "attention_type", None)  # read by some decoders' loops

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.output


@contextmanager
def _replayed(layers: nn.ModuleList | None, outputs: list[Any], first: int) -> Iterator[None]:
    """Layers before ``first`` replaced by their recorded outputs, put back on exit."""
    saved = []
    try:
        if layers is not None and len(outputs) == len(layers):
            for i in range(first):
                saved.append((i, layers[i]))
                layers[i] = _Replay(layers[i], outputs[i])
        yield
    finally:
        for i, layer in saved:
            layers[i] = layer  # type: ignore[index]


def _windows(tokenizer, texts: list[str]) -> torch.Tensor:
    """``WINDOWS`` windows of ``WINDOW_TOKENS`` tokens from the texts joined: no padding to mask."""
    tokens: list[int] = []
    for text in texts:
        tokens += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(tokens) >= WINDOWS * WINDOW_TOKENS:
            break
    n = min(WINDOWS, len(tokens) // WINDOW_TOKENS)
    if n == 0:
        n, width = 1, len(tokens)
    else:
        width = WINDOW_TOKENS
    return torch.tensor(tokens[: n * width]).reshape(n, width)


def _kld(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over tokens of KL(source || artifact)."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    return float((reference.exp() * (reference - logq)).sum(-1).mean())


def _memory_names(model: nn.Module, unit: Unit) -> set[str]:
    """The in-memory modules holding ``unit``: each Linear, or a fused experts module whole."""
    rename = disk_to_memory(model)
    names = set()
    for module in unit.modules:
        memory = rename(module)
        key = expert_key(memory)
        if key is not None and isinstance(_get(model, key[0]), RoutedExperts):
            names.add(key[0])
        else:
            names.add(memory)
    return names


def _get(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


@contextmanager
def _restored(artifact: nn.Module, source: nn.Module, unit: Unit) -> Iterator[None]:
    """``artifact`` with ``unit``'s modules swapped for the source's, swapped back on exit."""
    swapped = []
    try:
        for name in sorted(_memory_names(artifact, unit)):
            parent_name, _, child = name.rpartition(".")
            parent = artifact.get_submodule(parent_name)
            swapped.append((parent, child, getattr(parent, child)))
            setattr(parent, child, source.get_submodule(name))
        yield
    finally:
        for parent, child, module in swapped:
            setattr(parent, child, module)
