"""What one run did: ``RunOutcome`` (``<out>/outcome.json``) and the typed results its tasks return.

Each flow task returns its stage's own result (a build's ``BuiltArtifact``, an evaluation's
``results.EvaluationPart``, the gate's ``report_schema.Report``, repair's ``RepairOutcome``,
publish's ``PublishOutcome``), so the flow, ``quantgate run`` and a reader of outcome.json use
fields, not string keys: a renamed field is a type error where it is read, not a ``KeyError`` at
the end of a run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

from quantgate.contracts.report_schema import Report
from quantgate.contracts.results import EvaluationPart
from quantgate.publish import PublishOutcome
from quantgate.repair import RepairOutcome
from quantgate.runtime.frozen import FrozenRecord

OUTCOME = "outcome.json"


class BuiltArtifact(FrozenRecord):
    """One artifact a build step installed, as its manifest says: what publish later confirms it
    still is (build key and the digest of its files) and what an evaluation's cache key is made of."""

    target: str
    build_key: str
    files: str  # digest of {relative path: sha256} of every file
    bytes: int
    linked_from: str | None  # the twin it was hard-linked from; None: built
    ran_in: str  # host:pid of the process the task ran in

    def what(self) -> dict[str, object]:
        """What was built, not where: the evaluation's cache key part."""
        return self.model_dump(mode="json", exclude={"ran_in"})


class Evaluated(EvaluationPart):
    """An evaluation part and the process its task ran in (host:pid)."""

    ran_in: str


class ReportPaths(FrozenRecord):
    """The gate's report files."""

    json_path: Path
    md: Path | None = None
    html: Path | None = None

    def shown(self) -> list[Path]:
        """The files a person opens, Markdown first."""
        return [p for p in (self.md, self.html, self.json_path) if p is not None]


class Gated(FrozenRecord):
    """The gate task's result: its decision and where the reports were written."""

    report: Report
    paths: ReportPaths

    def judged(self) -> str:
        """'9 verdicts: 6 pass, 3 fail'."""
        kinds = Counter(v.verdict for v in self.report.verdicts)
        counts = ", ".join(f"{n} {verdict}" for verdict, n in kinds.most_common())
        return f"{len(self.report.verdicts)} verdicts: {counts}" if counts else "no verdicts"

    def failing(self) -> list[str]:
        """Required artifacts that passed no tenant: the run fails and publishes nothing."""
        return [a for a in self.report.required if not self.report.approvals.get(a)]


class VerdictRow(FrozenRecord):
    """One (artifact, tenant) verdict, without its floors (those are in report.json)."""

    artifact: str
    tenant: str
    verdict: Literal["pass", "fail"]


class Published(FrozenRecord):
    """What the run did to the registry: the artifacts it published and the repaired variants
    chosen, or, when it failed its gate, the approvals it withdrew."""

    registered: PublishOutcome | None = None
    repaired: list[PublishOutcome] = []
    withdrawn: dict[str, list[str]] = {}  # registered model -> aliases taken off

    def aliases(self) -> dict[str, list[str]]:
        """artifact -> the aliases publish pointed at its version (none when the run withdrew instead)."""
        return {a.artifact: a.aliases for a in self.registered.artifacts} if self.registered else {}


class RunOutcome(FrozenRecord):
    """``<out>/outcome.json``: one run's result, for ``quantgate run``'s summary and for machines."""

    model: str
    model_class: str
    source_hash: str
    targets: list[str]
    builds: list[BuiltArtifact]
    build_failures: dict[str, str]  # target -> the failed step's message
    evaluations: list[Evaluated]  # the source's first, then each artifact's
    evaluation_failures: list[str]
    approvals: dict[str, list[str]]
    required: list[str]
    verdicts: list[VerdictRow]
    reports: ReportPaths
    repair: RepairOutcome | None = None
    published: Published | None = None  # None: --no-publish
    exit_code: int
    out: Path
    flow_run_id: str
    flow_ran_in: str
    task_runner: str
    tasks_ran_in: list[str]

    @classmethod
    def read(cls, out: Path) -> RunOutcome:
        """``<out>/outcome.json`` as written by this quantgate."""
        return cls.model_validate_json((Path(out) / OUTCOME).read_bytes())
