"""lm-eval's tasks built without its index of its own tasks (``lmeval.inline_tasks``) are the tasks
``simple_evaluate`` built with the full index: same config, same prompts. The index cost 12.6 s
of every lm-eval suite on 2 cores (issue 45, item 9)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.evaluate.lmeval import inline_tasks, task_config


def _gsm8k(tmp_path: Path) -> dict:
    rows = [
        {"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
        for i in range(8)
    ]
    files = {}
    for split in ("train", "test"):
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        files[split] = str(path)
    config = task_config("gsm8k/gsm8k.yaml")
    config.update(
        task="quantgate_gsm8k",
        dataset_path="json",
        dataset_name=None,
        dataset_kwargs={"data_files": files, "cache_dir": str(tmp_path / "hf-datasets")},
    )
    config.pop("tag", None)
    return config


def _described(manager, config: dict) -> tuple[str, list[str]]:
    task = manager.load([config])["tasks"][config["task"]]
    task.set_fewshot_seed(seed=1234)
    docs = list(task.test_docs())[:3]
    contexts = [task.fewshot_context(doc, num_fewshot=2) for doc in docs]
    return repr(task.config), contexts


@pytest.mark.unit
@pytest.mark.heavy
def test_the_inline_task_manager_builds_the_task_the_indexed_one_builds(tmp_path: Path):
    from lm_eval.tasks import TaskManager

    config = _gsm8k(tmp_path)
    indexed = _described(TaskManager(metadata={}), config)
    inline = _described(inline_tasks(), config)
    assert inline == indexed
    assert "Question: What is 0 plus 0?" in inline[1][0]  # the prompt really was built
