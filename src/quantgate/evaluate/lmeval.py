"""lm-evaluation-harness where it defines the benchmark: prompts, few-shot, stops, extraction.

We run lm-eval's own task definitions (``gsm8k.yaml``, ``humaneval.yaml``) through its
evaluator with two changes, made in ``run_task``: data comes from local files through the
``json`` loader (build machines have no hub), and batch size and context length are pinned
from the suite profile for the source and every artifact alike (lm-eval's results change with
both). HumanEval's unsandboxed ``code_eval`` is replaced in ``suites/humaneval.py``. Per-sample
logs are always kept: the gate pairs source and artifact item by item.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any, TypedDict, Unpack


def task_config(task_file: str, *, resolve_functions: bool = True) -> dict[str, Any]:
    """lm-eval's own YAML for a task (``gsm8k/gsm8k.yaml``).

    ``resolve_functions=False`` leaves ``!function`` tags unimported: HumanEval's ``utils.py``
    loads and *runs* ``code_eval`` at import time, outside any sandbox.
    """
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(lm_eval.__file__).parent / "tasks" / task_file
    return copy.deepcopy(load_yaml(path, resolve_func=resolve_functions))


class TaskOptions(TypedDict):
    """How ``run_task`` and ``run_task_on`` run a task: its local data, the items, and the pinned sizes."""

    data_files: dict[str, str]
    cache_dir: Path
    items: list[int]
    batch_size: int
    max_gen_toks: int
    num_fewshot: int


def inline_tasks():
    """An lm-eval ``TaskManager`` without lm-eval's index of its own tasks.

    Why: ``simple_evaluate`` without one builds ``TaskManager()``, which reads every task YAML that
    lm-eval ships (thousands) to index them by name: 12.6 s on 2 cores, once per lm-eval suite and
    evaluation step, where we pass the one task as a config dict (``task_config``, its
    ``include`` already resolved) and no name is looked up. The task built is the same
    (``tests/unit/evaluate/test_lmeval_tasks.py``).
    """
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=False, metadata={})  # metadata: simple_evaluate's own default


def run_task(
    model, tokenizer, config: dict[str, Any], *, max_length: int, **options: Unpack[TaskOptions]
) -> list[dict[str, Any]]:
    """Run one lm-eval task on a loaded model; return its per-sample log, sorted by doc_id. The
    backend is lm-eval's HF one, its greedy generation through ``decode`` with the stop sequences
    checked every few steps (``lmeval_hf``)."""
    from quantgate.evaluate import decode
    from quantgate.evaluate.lmeval_hf import QuantgateHFLM

    lm = QuantgateHFLM(
        pretrained=model, tokenizer=tokenizer, batch_size=options["batch_size"], max_length=max_length
    )
    try:
        return run_task_on(lm, config, **options)
    finally:
        decode.release(model)


def run_task_on(lm, config: dict[str, Any], **options: Unpack[TaskOptions]) -> list[dict[str, Any]]:
    """``run_task`` with any lm-eval ``LM``: the per-sample log, sorted by ``doc_id``.

    Each log's ``doc_id`` is the item's index in the split (one of ``items``), ``resps`` one
    list of generations per request, and ``filtered_resps`` the task filter's output per
    request (a list again where the filter keeps one value per generation).
    """
    from lm_eval import simple_evaluate

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    config = copy.deepcopy(config)
    name = f"quantgate_{config['task']}"
    config.update(
        task=name,
        dataset_path="json",
        dataset_name=None,
        dataset_kwargs={
            "data_files": options["data_files"],
            "cache_dir": str(options["cache_dir"] / "hf-datasets"),
        },
    )
    config.pop("tag", None)
    config.setdefault("generation_kwargs", {})["max_gen_toks"] = options["max_gen_toks"]
    result = simple_evaluate(
        model=lm,
        tasks=[config],
        task_manager=inline_tasks(),
        num_fewshot=options["num_fewshot"],
        samples={name: options["items"]},
        log_samples=True,
        batch_size=options["batch_size"],
        confirm_run_unsafe_code=False,
    )
    return sorted(result["samples"][name], key=lambda s: int(s["doc_id"]))
