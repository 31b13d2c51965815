"""revgate command-line: traces, open-loop replay, and gate reports."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from revgate.manifests.errors import RevgateError

EXIT_BY_OUTCOME = {"pass": 0, "fail": 1, "inconclusive": 3}


class UsageInvalid(RevgateError):
    """A command-line value is malformed; nothing was done."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``trace``, ``replay`` and ``gate``."""
    trace = subparsers.add_parser("trace", help="write a synthetic reference-task trace (JSON lines)")
    trace.add_argument("out", type=Path)
    trace.add_argument("--requests", type=int, default=1000)
    trace.add_argument("--rate", type=float, default=20.0, help="mean requests per second")
    trace.add_argument("--arrivals", choices=("poisson", "bursty"), default="poisson")
    trace.add_argument("--labelled", type=float, default=1.0, help="fraction of requests carrying their reference")
    trace.add_argument("--mix", action="append", default=[], metavar="SLICE=WEIGHT", help="e.g. sort/long=0.5")
    trace.add_argument("--seed", type=int, default=0)
    trace.set_defaults(func=run_trace)

    replay = subparsers.add_parser("replay", help="replay a trace open-loop against an OpenAI-compatible URL")
    replay.add_argument("trace", type=Path)
    replay.add_argument("--target", required=True, help="base URL ending in /v1")
    replay.add_argument(
        "--model", default="", help="model name for bodies that name none (default: the server's first)"
    )
    replay.add_argument("--out", type=Path, help="records file (JSON lines); default: TRACE.records.jsonl")
    replay.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    replay.add_argument("--no-progress", action="store_true")
    replay.add_argument("--credential-file", type=Path,
                        help="a credential the route trusts (x-revgate-credential): the router then takes the "
                             "trace's slice labels as evidence; without one they are ignored")
    replay.set_defaults(func=run_replay)

    gate = subparsers.add_parser("gate", help="judge request records against a gate policy")
    gate.add_argument("records", type=Path, nargs="+")
    gate.add_argument("--policy", type=Path, required=True)
    gate.add_argument("--stable", help="stable revision (default: records with arm=stable)")
    gate.add_argument("--candidate", help="candidate revision (default: records with arm=candidate)")
    gate.add_argument(
        "--grader", choices=("reference-task", "exact", "normalised", "judge"), default="reference-task",
        help="how answers are scored; judge: ask a model at --judge-url to score them against --rubric",
    )
    gate.add_argument("--judge-url", help="base URL ending in /v1 of an OpenAI-compatible judge (with --grader judge)")
    gate.add_argument("--judge-model", default="judge", help="the judge's served model name")
    gate.add_argument("--rubric", type=Path, help="text file: what a good answer is (with --grader judge)")
    gate.add_argument("--expected-share", type=float, help="the route's candidate share, for the sample-ratio check")
    gate.add_argument("--final", action="store_true", help="the stage has ended")
    gate.add_argument("--out", type=Path, help="write the gate report (canonical JSON) here")
    gate.add_argument("--plots", type=Path, help="write evidence figures into this folder")
    gate.set_defaults(func=run_gate)


def _mix(items: list[str]) -> dict[str, float]:
    mix = {}
    for item in items:
        name, _, weight = item.partition("=")
        try:
            mix[name] = float(weight)
        except ValueError:
            raise UsageInvalid(f"bad --mix {item!r}", fix="Write SLICE=WEIGHT, e.g. sort/long=0.5.") from None
    return mix


def run_trace(args: argparse.Namespace) -> int:
    """Generate and write a trace."""
    from revgate.evaluation.traces import generate_trace, write_trace

    entries = generate_trace(
        args.requests,
        args.rate,
        seed=args.seed,
        arrivals=args.arrivals,
        mix=_mix(args.mix),
        labelled_fraction=args.labelled,
    )
    write_trace(entries, args.out)
    span = entries[-1].offset_s if entries else 0.0
    print(f"wrote {len(entries)} requests over {span:.1f} s to {args.out}")
    return 0


def _served_model(target: str) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(target.rstrip("/") + "/models", timeout=10) as response:  # noqa: S310 - operator's URL
            return str(json.loads(response.read())["data"][0]["id"])
    except (OSError, KeyError, IndexError, ValueError) as error:
        raise UsageInvalid(
            f"cannot ask the target for its model: {error}",
            where=target,
            fix="Pass --model, or check that the URL ends in /v1 and the server is up.",
        ) from None


def run_replay(args: argparse.Namespace) -> int:
    """Replay open-loop with a progress bar, write records, print the summary."""
    from tqdm import tqdm

    from revgate.evaluation.evidence import write_records
    from revgate.evaluation.replay import replay
    from revgate.evaluation.traces import read_trace
    from revgate.serving.token_file import load_token

    credential = load_token(args.credential_file, what="credential", flag="--credential-file") \
        if args.credential_file else ""
    entries = read_trace(args.trace)
    model = args.model or _served_model(args.target)
    out = args.out or args.trace.with_suffix(".records.jsonl")
    with tqdm(total=len(entries), unit="req", disable=args.no_progress, file=sys.stderr) as bar:
        result = asyncio.run(
            replay(entries, args.target, model, timeout_s=args.timeout, on_record=lambda _: bar.update(),
                   credential=credential)
        )
    write_records(result.records, out)
    print_summary(result.records, result.lateness_s, result.wall_s)
    print(f"records: {out}")
    return 0


def print_summary(records: Any, lateness_s: Any, wall_s: float) -> None:
    """Outcome rates, latency quantiles and the generator's own lateness."""
    import numpy as np

    from revgate.evaluation.metrics import summarize

    summary = summarize(records)
    late = np.asarray(lateness_s, dtype=float) * 1000.0
    print(f"{len(records)} requests in {wall_s:.1f} s ({len(records) / max(wall_s, 1e-9):.1f} req/s)")
    for key, value in summary.items():
        print(f"  {key:22} {'-' if value is None else f'{value:.4g}'}")
    if late.size:
        p50, p99 = np.quantile(late, 0.5), np.quantile(late, 0.99)
        print(f"  generator lateness ms  p50 {p50:.2f}  p99 {p99:.2f}  max {late.max():.2f}")


def run_gate(args: argparse.Namespace) -> int:
    """Judge the records and print the report; exit 0 pass, 1 fail, 3 inconclusive."""
    from revgate.evaluation import evidence as ev
    from revgate.evaluation.gates import gates_from_policy, judge
    from revgate.manifests.gates import GatePolicy

    try:
        policy = GatePolicy.from_json(args.policy.read_bytes(), source=str(args.policy))
    except OSError as error:
        raise UsageInvalid(
            f"cannot read the policy: {error.strerror}", where=str(args.policy), fix="Give a policy file."
        ) from None
    records = [r for path in args.records for r in ev.read_records(path)]
    stable, candidate = ev.split_arms(records, args.stable, args.candidate)
    evidence = ev.build_evidence(
        stable, candidate, _grader(args), expected_candidate_share=args.expected_share, final=args.final
    )
    report = judge(gates_from_policy(policy, args.expected_share), policy, evidence)
    print(render_report(report))
    if args.out:
        tmp = args.out.with_name(f".{args.out.name}.tmp")
        tmp.write_bytes(report.canonical())
        tmp.replace(args.out)
    if args.plots:
        write_plots(evidence, policy, args.plots)
    return EXIT_BY_OUTCOME[report.outcome]


def _grader(args: argparse.Namespace) -> Any:
    """The grader named on the command line; the judge needs its URL and a readable rubric."""
    from revgate.evaluation import evidence as ev
    from revgate.evaluation import graders

    if args.grader != "judge":
        return ev.GRADERS[args.grader]
    if not args.judge_url or args.rubric is None:
        raise UsageInvalid(
            "--grader judge needs --judge-url and --rubric", where="revgate gate",
            fix="Give the judge's /v1 URL and a rubric file.",
        )
    try:
        rubric = args.rubric.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageInvalid(f"cannot read the rubric: {error.strerror}", where=str(args.rubric),
                           fix="Give a rubric text file.") from None
    return graders.judge_grader(args.judge_url, args.judge_model, rubric)


def render_report(report: Any) -> str:
    """A plain-text table of the gate report."""
    lines = [f"gate report: {report.outcome.upper()}  evidence {report.evidence_digest}"]
    for label, revision, volume in (
        ("stable", report.stable_revision, report.stable),
        ("candidate", report.candidate_revision, report.candidate),
    ):
        lines.append(f"  {label:9} {revision}: {volume.requests} requests, {volume.output_tokens} output tokens")
    for gate in report.gates:
        lines.append(f"  {gate.gate:18} {gate.outcome:13} {gate.reason}")
        lines.extend(f"    {s.slice:30} {s.outcome:13} {s.reason}" for s in gate.slices)
    lines.extend(f"  note: {note}" for note in report.notes)
    return "\n".join(lines)


def write_plots(evidence: Any, policy: Any, folder: Path) -> None:
    """Quality per slice, latency CDFs, and each slice's sequential statistic."""
    from revgate.evaluation import plots
    from revgate.evaluation.gates import scores_by_slice

    folder.mkdir(parents=True, exist_ok=True)
    plots.quality_per_slice(evidence, policy, folder / "quality-per-slice.png")
    for metric in ("ttft", "e2e"):
        plots.latency_cdf(evidence, metric, folder / f"latency-{metric}-cdf.png")
    for name in sorted(scores_by_slice(evidence.candidate, evidence.candidate_scores, policy.slice_keys)):
        safe = name.replace("=", "-").replace(",", "_").replace("/", "-")
        plots.sequential_statistic(evidence, policy, name, folder / f"sequential-{safe}.png")
