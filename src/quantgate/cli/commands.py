"""The ``quantgate`` application: one command per module of this package, and the exit codes.

Exit codes (as the README states them): 0 success; 1 a required artifact failed (its build or
its gate); 2 bad input or usage, with a message naming the file and the fix; 75 a transient
failure (network, store I/O) that an orchestrator may retry.
"""

from __future__ import annotations

import errno
import sys

import typer

from quantgate.cli import (
    build,
    evaluate,
    gate,
    publish,
    pull,
    release,
    repair,
    replay,
    report,
    rollout,
    run,
    seed,
)
from quantgate.runtime.errors import DiskFullError, QuantgateError, StepFailed, TransientError
from quantgate.runtime.escape import visible
from quantgate.runtime.step_parent import end_with_parent

app = typer.Typer(
    name="quantgate",
    help="One source checkpoint in; per-hardware quantized artifacts out, each behind a quality gate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("build")(build.build)
app.command("eval")(evaluate.eval_)
app.command("gate")(gate.gate)
app.command("report")(report.report)
app.command("publish")(publish.publish)
app.command("pull")(pull.pull)
app.command("release")(release.release)
app.command("repair")(repair.repair)
app.command("replay")(replay.replay)
app.add_typer(rollout.app, name="rollout")
app.command("run")(run.run)
app.command("seed")(seed.seed)


@app.callback()
def _root() -> None:
    """One source checkpoint in; per-hardware quantized artifacts out, each behind a quality gate."""


def main() -> None:
    """Entry point: click handles usage errors (exit 2); quantgate's own errors exit with their code."""
    end_with_parent()  # a pipeline step ends with the run that started it
    try:
        from quantgate.declarations import (
            ACTIVATION_FORMATS,
            ENGINES,
            KV_CACHE_FORMATS,
            SUITE_KINDS,
            WEIGHT_FORMATS,
        )
        from quantgate.runtime.extensions import check_plugins

        check_plugins(
            [ENGINES, SUITE_KINDS, WEIGHT_FORMATS, ACTIVATION_FORMATS, KV_CACHE_FORMATS]
        )  # a plugin that cannot load is exit 2 naming it, before any work
        app()
    except QuantgateError as exc:
        # one error, one line: a name holding a newline or an escape cannot forge or hide a line
        # (a failed step's log tail keeps its own lines, each shown the same way)
        text = visible(exc, newlines=isinstance(exc, StepFailed))
        typer.secho(f"error: {text}", fg=typer.colors.RED, err=True)
        sys.exit(exc.exit_code)
    except (ConnectionError, TimeoutError) as exc:  # network or store hiccup: safe to retry
        typer.secho(f"error (transient, retry): {visible(exc)}", fg=typer.colors.RED, err=True)
        sys.exit(TransientError.exit_code)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a write outside quantgate's atomic helpers (which raise DiskFullError themselves)
        where = visible(exc.filename or "a file being written")
        typer.secho(
            f"error: {where}: no space left on device ({errno.errorcode[exc.errno]}). Fix: free space and re-run",
            fg=typer.colors.RED,
            err=True,
        )
        sys.exit(DiskFullError.exit_code)
