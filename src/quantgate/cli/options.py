"""The options the commands share, each declared once so that it means the same in every command.

A command takes the options below that apply to it; ``split``, ``out_dir``, ``refuse_beside_plan``,
``design`` and ``spread`` are how every command reads them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quantgate.runtime.errors import UsageError

if TYPE_CHECKING:
    from quantgate.runtime.sharding import Shards

CheckpointOpt = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint",
        help="Source checkpoint directory (safetensors, Hugging Face layout). "
        "Default: the embedded SmolLM2-135M-Instruct, converted once into the cache.",
    ),
]
TargetsOpt = Annotated[
    str | None,
    typer.Option(
        "--targets",
        help="Comma-separated targets (targets/<name>.yaml) this command works on, e.g. hopper-fp8,draft-int4. "
        "Default: the model class's targets from gates.yaml (build, run), every built artifact (eval), "
        "every failed target (repair).",
    ),
]
TenantsOpt = Annotated[
    str | None,
    typer.Option(
        "--tenants",
        help="Comma-separated tenants whose floors this command applies (gate: the verdicts; eval --sequential: "
        "when to stop; repair: the failures to repair). Default: every tenant (repair: those marked repair: true).",
    ),
]
SuitesOpt = Annotated[
    str | None, typer.Option("--suites", help="Comma-separated suites from eval_suites/ (default: all).")
]
GatesOpt = Annotated[
    Path | None,
    typer.Option(
        "--gates", help="Policy file: model classes and tenant floors. Default: <project>/gates.yaml."
    ),
]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="Calibration set spec for calibrated targets. Default: <project>/calibration_sets/default.yaml.",
    ),
]
CacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Where the converted default model and calibration sets are kept. "
        "Default: $QUANTGATE_CACHE or ~/.cache/quantgate.",
    ),
]
RootOpt = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="Project directory holding targets/, recipes/, gates.yaml. "
        "Default: $QUANTGATE_ROOT, else the checkout containing the working directory.",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Evaluation data (GSM8K, WikiText-2). Default: $QUANTGATE_DATA, else ../shared/datasets.",
    ),
]
PlanOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan",
        help="A run's plan.json (quantgate run writes it in --out): the source, targets, recipes, suites and "
        "cache come from it instead of intake and the config files; --targets picks some of its targets. "
        "The checkpoint is confirmed unchanged (a stat per file) before any work.",
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile", help="Suite sizes: 'smoke' (the default; minutes on 2 CPU cores) or 'full' (GPU scale)."
    ),
]
SequentialOpt = Annotated[
    bool | None,
    typer.Option(
        "--sequential/--fixed",
        help="Sequential (the default): score each suite in a seeded order, in batches, and stop once every "
        "floor on it is decided (always-valid bounds); fixed: every item.",
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        help="Where models compute: 'auto' (the default: CUDA when torch sees a GPU, else the CPU), 'cuda' or "
        "'cpu'. Recorded in run.json and each manifest.",
    ),
]
DevicesOpt = Annotated[
    str,
    typer.Option(
        "--devices",
        help="How many devices one model is spread over (tensor parallel, by the model's own transformers "
        "plan, one process each under torch.distributed.run): 'all' (the default: every GPU torch sees; one "
        "process on the CPU) or a count. On the CPU a count above 1 runs that many processes over gloo.",
    ),
]
MaxMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        help="The most memory one model may take on its device, as a size (40GB, 40GiB) or 'auto' (a GPU's "
        "free memory less a reserve for activations): the decoder layers past it are kept in host memory (on "
        "the CPU: on disk) and copied to the device for each forward, with the same numbers. Not given: every "
        "model wholly on its device.",
    ),
]
BuildMaxMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        help="The most memory a model calibrated whole (llm-compressor's basic pipeline: nvfp4) may take "
        "on the GPU, as a size (40GB) or 'auto'; past it, and past 80 % of the GPU's free memory, the "
        "library's sequential pipeline onloads one layer at a time, with the same bytes. From a run's "
        "plan when not given; no effect on the CPU.",
    ),
]
ResultsOpt = Annotated[Path, typer.Option("--results", help="Evaluation directory (quantgate eval --out).")]
ReportDirOpt = Annotated[
    Path, typer.Option("--report", help="Directory holding report.json (quantgate gate --out).")
]


def memory_budget(
    max_memory: str | None, devices: str, device: str, config: Path | None = None
) -> int | None:
    """``--max-memory`` as bytes (``offload.budget``), checked with ``--devices`` before any work: a
    value that is no size, or a budget beside a model spread over several devices, is a usage error."""
    from quantgate.runtime import offload, sharding

    budget = offload.budget(max_memory, device)
    if budget is not None and sharding.count(devices, device, config) > 1:
        raise UsageError(
            "--max-memory",
            "offloading layers is not combined with one model spread over devices",
            "pass --devices 1",
        )
    return budget


def spread(devices: str, device: str, config: Path | None = None) -> Shards | None:
    """This process's place in the group ``--devices`` asks for: None alone; the group torchrun
    started, when it did; else the command runs again under ``torch.distributed.run`` with one
    process per device, and this process exits with its status (before any work: the options are
    checked first, so a usage error is reported once, not by every rank)."""
    from quantgate.runtime import sharding

    wanted = sharding.count(devices, device, config)
    shards = sharding.current()
    if shards is None and wanted > 1:
        raise typer.Exit(sharding.launch(wanted, sys.argv[1:]))
    if shards is not None and devices.strip().lower() != "all" and wanted != shards.world:
        raise UsageError(
            "--devices",
            f"asks for {wanted} but torchrun started {shards.world} processes",
            "pass the same count",
        )
    return shards


def split(value: str | None) -> list[str] | None:
    """A comma-separated option as its names (None when not given or empty)."""
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def out_dir(path: Path, option: str) -> Path:
    """``path`` resolved, once it can be a directory to write in; ``UsageError`` (exit 2, before any
    work) when it, or its nearest existing parent, is a file, or is not writable."""
    path = path.resolve()
    existing = next(p for p in (path, *path.parents) if p.exists())
    where = "" if existing == path else f" (a parent of {path})"
    if not existing.is_dir():
        raise UsageError(
            existing,
            f"{option} needs a directory, but this{where} is an existing file",
            f"pass a directory for {option} (created when missing), or move the file away",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            existing,
            f"{option} is not writable here{where}",
            f"pass a directory you can write to for {option}, or fix its permissions",
        )
    return path


def refuse_beside_plan(given: dict[str, object]) -> None:
    """A plan carries the source and the configs: an option that would override them is a usage error."""
    for option, value in given.items():
        if value is not None:
            raise UsageError(
                option, "is taken from --plan here", f"leave {option} out, or leave --plan out to plan anew"
            )


def design(sequential: bool | None) -> bool:
    """--sequential/--fixed as given, else the default design (``evaluate.sequential.DEFAULT``)."""
    from quantgate.evaluate import DEFAULT

    return DEFAULT if sequential is None else sequential
