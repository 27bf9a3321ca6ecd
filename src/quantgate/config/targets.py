"""Hardware targets and the recipes they name, as validated data.

A target (``targets/<name>.yaml``) says what the serving hardware runs: the recipe that builds
it, the compressed-tensors format on disk, the numerics an evaluation must emulate, the KV
cache precision, and the serving contract every build is checked against (engine, oldest
release the fleet runs, tensor-parallel sizes). A recipe (``recipes/<name>.yaml``) says how to
build it: which engine, whether it needs calibration data, and the engine's own recipe, passed
through verbatim so that a recipe is exactly what llm-compressor (or modelopt) would read.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator

from quantgate.config.identity import content_digest
from quantgate.config.loader import load_model
from quantgate.runtime.errors import ConfigFileError, UsageError
from quantgate.runtime.frozen import Frozen
from quantgate.runtime.suggest import did_you_mean


class WeightNumerics(StrEnum):
    """The weights' number format as the hardware computes with it."""

    FP8_E4M3FN = "fp8_e4m3fn"  # OCP FP8, max 448 (Hopper, Blackwell)
    FP8_E4M3FNUZ = "fp8_e4m3fnuz"  # MI300 (gfx942): OCP bits reinterpreted, scales doubled
    NVFP4 = "nvfp4"  # E2M1 values, E4M3 scale per 16, FP32 global scale
    INT4 = "int4"


class ActivationNumerics(StrEnum):
    """How activations are quantized at run time (or not at all)."""

    NONE = "none"  # weight-only: activations stay in the compute dtype
    FP8_E4M3FN_PER_TOKEN = "fp8_e4m3fn_per_token"
    FP8_E4M3FNUZ_PER_TOKEN = "fp8_e4m3fnuz_per_token"  # dynamic, clamped at +-224 on CDNA3
    NVFP4_CALIBRATED = "nvfp4_calibrated"  # per-16 dynamic scales under a calibrated global scale


class KVCache(StrEnum):
    """The KV cache precision a target serves with."""

    BF16 = "bf16"
    FP8_E4M3 = "fp8_e4m3"


class Numerics(Frozen):
    """What an evaluation must emulate to measure what this hardware will compute.

    ``weights`` and ``activations`` name formats in the registries of ``quantgate.runtime.extensions``
    (quantgate's own are the members of ``WeightNumerics`` and ``ActivationNumerics``; a format
    registered from outside, through its entry point, is a valid name too): a new format is one
    module, and a target selects it by name with no edit here."""

    weights: str = Field(description="a weight format's name (WEIGHT_FORMATS)")
    activations: str = Field(description="an activation format's name (ACTIVATION_FORMATS), or 'none'")
    native_on: list[str] = Field(
        description="hardware on which these numerics run natively; elsewhere they are emulated"
    )

    @field_validator("weights")
    @classmethod
    def _weight_format(cls, name: str) -> str:
        from quantgate.declarations import WEIGHT_FORMATS  # names only: no numerics module is imported

        return _registered(name, WEIGHT_FORMATS.names(), "weight format")

    @field_validator("activations")
    @classmethod
    def _activation_format(cls, name: str) -> str:
        from quantgate.declarations import ACTIVATION_FORMATS

        if name == ActivationNumerics.NONE:
            return name
        return _registered(name, [ActivationNumerics.NONE, *ACTIVATION_FORMATS.names()], "activation format")


def _registered(name: str, names: list[str], what: str) -> str:
    if name not in names:
        raise ValueError(f"unknown {what} '{name}': {did_you_mean(name, names, known=f'known {what}s')}")
    return name


class Serving(Frozen):
    """The fleet's serving contract: the engine, the oldest release it runs, the TP sizes it deploys.

    Every build is checked against it (``quantgate.serving``): an artifact that no declared
    (release, TP size) can load is refused, and the TP sizes that cannot load are recorded.
    """

    engine: Literal["vllm"]
    min_version: str = Field(description="the oldest engine release the fleet runs, e.g. '0.33.0'")
    tensor_parallel: list[PositiveInt] = Field(min_length=1, description="tensor-parallel sizes deployed")

    @field_validator("min_version")
    @classmethod
    def _read_release(cls, version: str) -> str:
        """Only releases whose load rules were read from their source can be checked."""
        from quantgate.declarations.serving_releases import RELEASES_READ

        if version not in RELEASES_READ:
            raise ValueError(
                f"vLLM {version!r} is not a release whose load rules quantgate reproduces "
                f"({did_you_mean(version, RELEASES_READ, known='releases read')}); "
                "another release needs its rules read into quantgate.serving first"
            )
        return version

    @field_validator("tensor_parallel")
    @classmethod
    def _distinct(cls, sizes: list[int]) -> list[int]:
        """Each TP size once, in ascending order."""
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"tensor_parallel lists a size twice: {sizes}")
        return sorted(sizes)


class RepairUpgrade(Frozen):
    """What auto-repair keeps a sensitive layer group at: the next precision up on this hardware.

    ``scheme`` is the llm-compressor preset scheme the kept groups get in a second config group of
    the same compressed-tensors checkpoint (FP8_DYNAMIC under NVFP4); None keeps them in the
    source's precision (FP8 targets: the next step up is bf16, an ``ignore`` entry). ``numerics``
    is how the kept groups compute, for evaluation; None when they stay in the source's precision.
    """

    scheme: str | None = None
    format: Literal["float-quantized", "nvfp4-pack-quantized", "pack-quantized"] | None = None
    numerics: Numerics | None = None
    label: str = Field(description="how reports name the kept precision, e.g. 'FP8' or 'bf16'")

    @field_validator("numerics")
    @classmethod
    def _numerics_with_scheme(cls, numerics: Numerics | None, info: Any) -> Numerics | None:
        """A quantized upgrade needs the numerics to emulate it; an unquantized one has none."""
        scheme, fmt = info.data.get("scheme"), info.data.get("format")
        if (scheme is None) != (numerics is None) or (scheme is None) != (fmt is None):
            raise ValueError(
                "scheme, format and numerics are given together (a quantized upgrade) or not at all (bf16)"
            )
        return numerics


class Target(Frozen):
    """``targets/<name>.yaml``: what one piece of serving hardware runs, and its serving contract."""

    version: Literal[1] = 1
    name: str
    description: str
    hardware: str
    recipe: str
    format: Literal["float-quantized", "nvfp4-pack-quantized", "pack-quantized"]
    numerics: Numerics
    kv_cache: KVCache
    serving: Serving
    serving_notes: str = ""
    # auto-repair (quantgate.repair): the precision sensitive layer groups are kept at; None: no repair
    repair: RepairUpgrade | None = None


class Calibration(Frozen):
    """How much calibration data a recipe needs; ``required: false`` for data-free recipes."""

    required: bool
    num_samples: PositiveInt = 32
    max_seq_length: PositiveInt = 512
    pipeline: Literal["sequential", "basic"] | None = Field(
        None,
        description="llm-compressor's calibration pipeline; unset lets oneshot choose (sequential "
        "for calibrated recipes). basic runs each sample through the whole model once: for "
        "observer-only recipes it writes the same artifact faster, but holds the whole model on "
        "one device and cannot serve GPTQ-style layer-by-layer updates",
    )
    compute_dtype: Literal["bfloat16", "float32"] = Field(
        "bfloat16",
        description="the dtype the source is loaded in for calibration; the artifact is stored in "
        "bfloat16 either way. float32 for recipes whose cost is the calibration forward passes "
        "(GPTQ): CPUs without native bf16 (no AVX512-BF16/AMX) run bf16 matmuls 4-5x slower than "
        "float32, and float32 activations only make the Hessians more exact. One rule for every "
        "machine, so a recipe's numerics never depend on the CPU it ran on",
    )


class Recipe(Frozen):
    """``recipes/<name>.yaml``: the engine, its calibration needs, and its own recipe verbatim."""

    version: Literal[1] = 1
    name: str
    description: str
    engine: str = Field(description="a name in the engine registry (quantgate.quantize.engines)")
    calibration: Calibration
    requires_cuda: bool = False
    recipe: dict[str, Any] = Field(description="the engine's own recipe, passed through verbatim")

    @field_validator("engine")
    @classmethod
    def _registered(cls, name: str) -> str:
        """The registry is the one list of engines: a new engine needs no edit here."""
        from quantgate.declarations import ENGINES  # names only: no engine module is imported

        if name not in ENGINES.names():
            raise ValueError(
                f"unknown engine '{name}': {did_you_mean(name, ENGINES.names(), known='known engines')}"
            )
        return name

    def modifier(self) -> tuple[str, dict[str, Any]]:
        """The first modifier of an llm-compressor recipe as (type, args); the recipes here have one."""
        for stage in self.recipe.values():
            for group in stage.values():
                for kind, args in group.items():
                    return kind, args
        raise ConfigFileError(self.name, "the recipe has no modifier", "add one stage with one modifier")


def _names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


class Catalog:
    """The targets and recipes of one project root, loaded on demand.

    Passed around as context (no globals): tests point it at a temporary copy.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.targets_dir = self.root / "targets"
        self.recipes_dir = self.root / "recipes"

    def target_names(self) -> list[str]:
        """Names of every ``targets/*.yaml``, sorted."""
        return _names(self.targets_dir)

    def target(self, name: str) -> Target:
        """The validated target ``name``; its recipe is loaded too, so a dangling name fails here."""
        path = self.targets_dir / f"{name}.yaml"
        if not path.exists():
            raise UsageError(
                self.targets_dir,
                f"no target named '{name}'",
                did_you_mean(name, self.target_names(), known="known targets"),
            )
        target = load_model(path, Target)
        if target.name != name:
            raise ConfigFileError(
                path, f"name '{target.name}' differs from the file name", f"set name: {name}"
            )
        self.recipe(target.recipe, referenced_from=path)  # fail early on a dangling recipe
        return target

    def recipe_path(self, name: str) -> Path:
        """Where recipe ``name`` lives (whether or not it exists)."""
        return self.recipes_dir / f"{name}.yaml"

    def recipe(self, name: str, referenced_from: Path | None = None) -> Recipe:
        """The validated recipe ``name``; a missing one is blamed on ``referenced_from`` when given."""
        path = self.recipe_path(name)
        if not path.exists():
            raise ConfigFileError(
                referenced_from or path,
                f"recipe '{name}' does not exist in {self.recipes_dir}",
                "fix the name, or add the recipe file; "
                + did_you_mean(name, _names(self.recipes_dir), known="recipes"),
            )
        recipe = load_model(path, Recipe)
        if recipe.name != name:
            raise ConfigFileError(
                path, f"name '{recipe.name}' differs from the file name", f"set name: {name}"
            )
        return recipe

    def recipe_hash(self, name: str) -> str:
        """sha256 of the validated recipe (``identity.content_digest``), includes and all: any edit
        that changes what the recipe says changes every build key; a comment does not."""
        return content_digest(self.recipe(name))
