"""``quantgate replay``: a seeded sample of logged prompts through the stable and the canary
endpoints, compared paired (top-1 agreement, KL on the top log-probabilities, exact match, length
and refusal deltas). Prompts are never printed or written: each pair carries the prompt's sha256.

The sample follows the traffic mix of a calibration spec (``--spec``, the default model's by
default); prompts come from request logs (``--log``, JSONL of ``{id, version, class, prompt,
status}``) or, without ``--log``, from the spec's own traffic log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from quantgate.config import project_root


def _prompts(spec_path: Path, logs: list[Path], size: int, seed: int) -> list[str]:
    from quantgate.calibration import load_spec, read_traffic_log
    from quantgate.rollout import LoggedRequest, read_logs, sample_prompts

    spec = load_spec(spec_path)
    if logs:
        from quantgate.publish import LocalStore

        records = []
        for log in logs:
            records.extend(read_logs(LocalStore(str(log.resolve().parent)), [log.name]))
    else:
        records = [
            LoggedRequest(r["id"], "", r["class"], r["text"], "ok")
            for r in read_traffic_log(spec.traffic_log)
        ]
    return [r.prompt for r in sample_prompts(records, spec.mix, size, seed)]


def replay(
    stable: Annotated[
        str, typer.Option("--stable", help="The stable version's endpoint, e.g. http://10.0.0.5:8000.")
    ],
    canary: Annotated[str, typer.Option("--canary", help="The canary's endpoint.")],
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="Calibration spec whose traffic mix the sample follows. Default: calibration_sets/default.yaml.",
        ),
    ] = None,
    log: Annotated[
        list[Path] | None,
        typer.Option(
            "--log",
            help="Request log (JSONL) to sample prompts from; repeatable. Default: the spec's traffic log.",
        ),
    ] = None,
    size: Annotated[int, typer.Option("--size", min=1, help="Prompts to replay.")] = 16,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample.")] = 0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens generated per prompt.")] = 32,
    top_logprobs: Annotated[
        int, typer.Option("--top-logprobs", min=1, max=20, help="Log-probabilities returned per position.")
    ] = 5,
    model: Annotated[
        str | None, typer.Option("--model", help="The served model's name, for engines that check it (vLLM).")
    ] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds to wait for one completion.")
    ] = 120.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the evidence as JSON (pairs, summary, digest).")
    ] = False,
) -> None:
    """Replay a seeded, traffic-mixed sample of logged prompts on stable and canary, compared paired."""
    from quantgate.rollout import ReplaySettings, summary
    from quantgate.rollout import as_json as evidence_json
    from quantgate.rollout import replay_prompts as run_replay

    spec_path = spec or project_root() / "calibration_sets" / "default.yaml"
    prompts = _prompts(spec_path, log or [], size, seed)
    settings = ReplaySettings(
        max_tokens=max_tokens, top_logprobs=top_logprobs, model=model, timeout_s=timeout_s
    )
    evidence = run_replay(prompts, stable, canary, seed, settings)
    totals = summary(evidence)
    if as_json:
        typer.echo(json.dumps({**evidence_json(evidence), "summary": totals}, indent=2, sort_keys=True))
        return
    typer.echo(f"replay: {totals['prompts']} prompts, seed {seed}, {max_tokens} tokens, top-{top_logprobs}")
    typer.echo(f"  stable  {stable}\n  canary  {canary}")
    typer.echo(f"  {'measure':<16}{'mean':>10}")
    for key in ("top1_agreement", "kl", "exact_match", "length_delta", "refusal_delta"):
        if key in totals:
            typer.echo(f"  {key:<16}{totals[key]:>10.4f}")
    typer.echo(f"  digest {evidence.digest}")
