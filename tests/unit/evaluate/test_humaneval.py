"""HumanEval solutions as lm-eval logs them: a right completion passes its tests in the sandbox, a wrong one fails.

The language model here is a fake (``CannedLM``, an lm-eval ``LM`` that answers each prompt
with a fixed completion) so that the answer is known; everything after it is real: lm-eval's
humaneval task, its filter and per-sample log, the suite's program, the sandbox.
"""

from __future__ import annotations

import pytest
from lm_eval.api.model import LM

from quantgate.evaluate.lmeval import run_task_on
from quantgate.evaluate.sandbox import run_check, unavailable
from quantgate.evaluate.suites.humaneval import (
    HumanEvalSuite,
    check_for,
    problems,
    problems_file,
    solution_of,
)

pytestmark = pytest.mark.unit

ITEMS = [0, 2, 4]


class CannedLM(LM):
    """Answers each HumanEval prompt with the completion given for it."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers = answers

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        return [self.answers[request.args[0]] for request in requests]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


def _logs(tmp_path, answer) -> list[dict]:
    config = HumanEvalSuite._config(None)  # type: ignore[arg-type]  # the task config needs no spec
    lm = CannedLM({p["prompt"]: answer(p) for p in problems()})
    return run_task_on(
        lm,
        config,
        data_files={"test": str(problems_file())},
        cache_dir=tmp_path,
        items=ITEMS,
        batch_size=1,
        max_gen_toks=64,
        num_fewshot=0,
    )


@pytest.mark.heavy
@pytest.mark.skipif(unavailable() is not None, reason=f"no sandbox can be built here: {unavailable()}")
def test_canonical_completions_pass_and_wrong_ones_fail_through_lm_evals_log_fake_lm(tmp_path):
    right = _logs(tmp_path, lambda p: p["canonical_solution"])
    assert [log["doc_id"] for log in right] == ITEMS  # the split's index, as the suite pairs them
    # lm-eval logs the filter's output per request, a list: formatting it whole defines nothing
    assert isinstance(right[0]["filtered_resps"][0], list)
    for log in right:
        result = run_check(solution_of(log), check_for(log["doc"]))
        assert result.passed, (log["doc"]["task_id"], result)
    for log in _logs(tmp_path, lambda p: "    return None\n"):
        result = run_check(solution_of(log), check_for(log["doc"]))
        assert result.status == "failed" and result.returncode == 1, result
        assert result.stderr_tail.splitlines()[-1].startswith(("AssertionError", "TypeError")), result
