"""The MLflow evidence ledger: what was pinned, verified, measured, decided, approved and routed.

One MLflow run per promotion attempt holds the evidence as canonical JSON artifacts, each tagged
with its digest, so an auditor can check a document against the digest a decision named. The
candidate is registered as a model version whose aliases (``stable``, ``candidate``) move with the
route; MLflow keeps no alias history, so every move is also recorded as a registered-model tag.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from revgate.manifests.canonical import sha256_digest
from revgate.manifests.document import Document
from revgate.manifests.errors import RevgateError
from revgate.manifests.gates import GateReport
from revgate.registry.attestation import (
    DECISIONS,
    RunFacts,
    attestation_names,
    is_gate_report,
    parse_statement,
    predicate_problems,
    statement_digest,
)
from revgate.registry.audit import (
    ApprovalRecord,
    AttestationCheck,
    RunEvidence,
    SignatureAudit,
    attached,
    check_documents,
    counted_approvals,
    parse_approval,
    recorded_digests,
    recorded_steps,
    report_for,
    statement_problem,
)
from revgate.registry.auditor_view import (
    StageSummary,
    VersionFacts,
    stage_metrics,
    summarize,
    version_description,
    version_tags,
)


class LedgerUnavailable(RevgateError):
    """The MLflow tracking store could not be reached or written."""


def sqlite_uri(path: Path) -> str:
    """The tracking URI of a local SQLite store (the embedded default)."""
    return f"sqlite:///{path.resolve()}"


def sqlite_file(tracking_uri: str) -> Path | None:
    """The file of an embedded ``sqlite:///PATH`` store; None for a tracking server."""
    return Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _store_creation_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive lock beside an embedded SQLite store (``FILE.lock``); a server needs none."""
    database = sqlite_file(tracking_uri)
    if database is None:
        yield
        return
    lock = database.with_name(database.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# MLflow's own defaults for a tracking server: 120 s for each answer and 7 retries with a growing backoff,
# so one unanswered write held a rollout for many minutes before it could say the ledger was away. A
# write before the decision that fails stops the rollout (nothing is decided on evidence an auditor will
# not find); one after it is held by the outbox and retried there, so short bounds lose nothing.
HTTP_TIMEOUT_S, HTTP_RETRIES = 20, 2


def bound_tracking_requests(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Explicit timeouts and retries for every request to a tracking server, unless the operator set their own
    (MLflow reads them from the environment at each request)."""
    environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))


@dataclass(frozen=True, slots=True)
class EvidenceRun:
    """An open evidence run: its id and the experiment it belongs to."""

    run_id: str
    experiment_id: str


class EvidenceLedger:
    """Writes evidence to MLflow through its client API (no global ``mlflow`` state)."""

    def __init__(self, tracking_uri: str, artifact_root: Path) -> None:
        from mlflow.tracking import MlflowClient  # heavy: imported only where evidence is written

        bound_tracking_requests()
        with _store_creation_lock(tracking_uri):
            # The first use of a new SQLite file creates MLflow's tables; promotions that start
            # together would each create them, and all but one fail ("table ... already exists").
            self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
            self.client.search_registered_models(max_results=1)  # the registry's store opens lazily
        self.artifact_root = artifact_root
        self.tracking_uri = tracking_uri

    def _artifact_location(self, route: str) -> str | None:
        """Where a new experiment's evidence files go: a tracking server keeps them itself (its artifact store,
        which it serves); only a local store keeps them under ``artifact_root``. A path here, given to a server,
        would name the controller's own disk, which no auditor on another host can read."""
        if self.tracking_uri.startswith(("http://", "https://")):
            return None
        return (self.artifact_root / route).resolve().as_uri()

    def reachable(self) -> bool:
        """Whether the tracking store answers at all (one cheap read); raises what the client raised if not."""
        self.client.search_experiments(max_results=1)
        return True

    def open_run(self, route: str, candidate: str, tags: Mapping[str, str] | None = None) -> EvidenceRun:
        """Start the evidence run of one promotion attempt of ``candidate`` on ``route``."""
        name = f"revgate/{route}"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(name, artifact_location=self._artifact_location(route))
        )
        all_tags = {"revgate.route": route, "revgate.candidate": candidate, **(tags or {})}
        run = self.client.create_run(experiment_id, tags=all_tags, run_name=f"promote {candidate[7:19]}")
        return EvidenceRun(run.info.run_id, experiment_id)

    def log_document(self, run: EvidenceRun, name: str, document: Document) -> str:
        """Log ``document`` as canonical JSON under ``evidence/NAME.json``; tag and return its digest."""
        self.client.log_text(run.run_id, document.canonical().decode(), f"evidence/{name}.json")
        self.client.set_tag(run.run_id, f"revgate.digest.{name}", document.digest)
        return document.digest

    def logged_names(self, run: EvidenceRun) -> set[str]:
        """The names of the evidence logged in the run so far (each is digest-tagged)."""
        return set(recorded_digests(self.client.get_run(run.run_id).data.tags))

    def next_name(self, run: EvidenceRun, stem: str, *, plain_first: bool = False) -> str:
        """The first evidence name of the series ``STEM-1``, ``STEM-2``, ... not logged yet in the run
        (with ``plain_first``: ``STEM``, then ``STEM-2``, ...), so a second answer never overwrites the first."""
        taken = self.logged_names(run)
        if plain_first and stem not in taken:
            return stem
        number = 2 if plain_first else 1
        while f"{stem}-{number}" in taken:
            number += 1
        return f"{stem}-{number}"

    def log_json_new(self, run: EvidenceRun, stem: str, data: Any, *, plain_first: bool = False) -> str:
        """Log ``data`` under the next free name of the series ``stem`` (:meth:`next_name`); the name used.

        :meth:`log_json` replaces what was logged under the same name (the file and its digest tag);
        evidence that may come more than once in a run (answers to the approval form) goes here.
        """
        name = self.next_name(run, stem, plain_first=plain_first)
        self.log_json(run, name, data)
        return name

    def tag(self, run: EvidenceRun, key: str, value: str) -> None:
        """Set one tag on the evidence run."""
        self.client.set_tag(run.run_id, key, value)

    def log_json(self, run: EvidenceRun, name: str, data: Any) -> None:
        """Log plain JSON evidence (records summaries, step logs) under ``evidence/NAME.json``.

        A second call with the same name replaces the first (file and digest tag): evidence that
        can come more than once goes through :meth:`log_json_new`."""
        text = json.dumps(data, indent=2, sort_keys=True, default=str)
        self.client.log_text(run.run_id, text, f"evidence/{name}.json")
        # Tagged like a document, so an audit checks these bytes too (the approval among them).
        self.client.set_tag(run.run_id, f"revgate.digest.{name}", sha256_digest(text.encode()))

    def log_file(self, run: EvidenceRun, path: Path, folder: str = "evidence") -> None:
        """Attach a file (a plot, a records file) to the run."""
        self.client.log_artifact(run.run_id, str(path), folder)

    def log_step(self, run: EvidenceRun, step: str, outcome: str, metrics: Mapping[str, float] | None = None) -> None:
        """Record that a promotion step ended with ``outcome`` (a tag per step, metrics alongside)."""
        self.client.set_tag(run.run_id, f"revgate.step.{step}", outcome)
        for key, value in (metrics or {}).items():
            self.client.log_metric(run.run_id, f"{step}.{key}", value)

    def log_gate_report(self, run: EvidenceRun, name: str, report: GateReport, markdown: str, stage: int) -> str:
        """A gate report as canonical JSON, as readable markdown beside it (both digest-tagged), and its
        figures as metrics at step ``stage``, so MLflow's charts follow the stages and compare rollouts."""
        digest = self.log_document(run, name, report)
        self.log_readable(run, f"{name}.md", markdown)
        self.log_metrics(run, stage_metrics(report), step=stage)
        return digest

    def log_readable(self, run: EvidenceRun, name: str, text: str) -> None:
        """A readable rendering (markdown, HTML) under ``evidence/NAME``, tagged with its digest for the audit."""
        self.client.log_text(run.run_id, text, f"evidence/{name}")
        self.client.set_tag(run.run_id, f"revgate.digest.{name}", sha256_digest(text.encode()))

    def log_attachment(self, run: EvidenceRun, path: Path) -> None:
        """A file (a plot) under ``evidence/`` by its own name, tagged with its digest for the audit."""
        self.client.log_artifact(run.run_id, str(path), "evidence")
        self.client.set_tag(run.run_id, f"revgate.digest.{path.name}", sha256_digest(path.read_bytes()))

    def log_metrics(self, run: EvidenceRun, values: Mapping[str, float], step: int) -> None:
        """Several metrics at one step, in one request."""
        from mlflow.entities import Metric

        now = int(datetime.now(UTC).timestamp() * 1000)
        metrics = [Metric(key, float(value), now, step) for key, value in sorted(values.items())]
        for start in range(0, len(metrics), 900):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(run.run_id, metrics=metrics[start:start + 900])

    def describe_version(self, model: str, version: str, facts: VersionFacts) -> None:
        """The version page's description and tags: decision, when, approver, signer, gates, the run's link."""
        from revgate.registry.follow import ROUTE_STATUS, with_route_status

        description = version_description(facts)
        before = (self.client.get_model_version(model, version).description or "").splitlines()
        if before and before[0].startswith(ROUTE_STATUS):  # where the route stands is kept as it was
            description = with_route_status(description, before[0])
        self.client.update_model_version(model, version, description=description)
        for key, value in version_tags(facts).items():
            self.client.set_model_version_tag(model, version, key, value)

    def stage_summaries(self, run_id: str) -> tuple[StageSummary, ...]:
        """Each gate report the run logged, as its line in a version description, in stage order."""
        stored = self.evidence_files(run_id)
        names = sorted(name for name in stored if name.startswith("gate-report-") and not attached(name))
        return tuple(summarize(GateReport.model_validate_json(stored[name]), name.split("-", 3)[-1])
                     for name in names)

    def latest_run(self, route: str) -> Any | None:
        """The newest promotion run of ``route`` (an MLflow Run), or None when there is none."""
        experiment = self.client.get_experiment_by_name(f"revgate/{route}")
        if experiment is None:
            return None
        runs = self.client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"],
                                       max_results=1)
        return runs[0] if runs else None

    def latest_gate_report(self, run_id: str) -> tuple[str, GateReport] | None:
        """The run's newest gate report by name (``gate-report-NN-STAGE``), or None before the first."""
        stored = self.evidence_files(run_id)
        names = sorted(name for name in stored if name.startswith("gate-report-") and not attached(name))
        if not names:
            return None
        return names[-1], GateReport.model_validate_json(stored[names[-1]])

    def close(self, run: EvidenceRun, decision: str) -> None:
        """End the run with the promotion's decision (promoted, rolled_back, paused, failed)."""
        self.client.set_tag(run.run_id, "revgate.decision", decision)
        status = "FINISHED" if decision in ("promoted", "rolled_back") else "FAILED"
        self.client.set_terminated(run.run_id, status=status)

    def register_version(self, run: EvidenceRun, model: str, fingerprint: str) -> str:
        """Register the candidate as a version of ``model`` whose source is this run's evidence."""
        self._ensure_model(model)
        source = f"{self.client.get_run(run.run_id).info.artifact_uri}/evidence"
        version = self.client.create_model_version(
            model, source=source, run_id=run.run_id, tags={"revgate.fingerprint": fingerprint}
        )
        return str(version.version)

    def _ensure_model(self, model: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(model)
        except MlflowException as error:
            if "already exists" not in str(error).lower():
                raise LedgerUnavailable(f"cannot create registered model: {error}", where=model) from None

    def version_of(self, model: str, fingerprint: str) -> str | None:
        """The newest version of ``model`` registered for the revision ``fingerprint``; None if there is none."""
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(f"name = '{model.replace(chr(39), '')}'")
        except MlflowException:
            return None
        ours = [int(v.version) for v in versions if v.tags.get("revgate.fingerprint") == fingerprint]
        return str(max(ours)) if ours else None

    def register_route_version(self, model: str, fingerprint: str, route: str, generation: int) -> str:
        """Register a revision the route serves that no promotion run registered (a route's first stable)."""
        self._ensure_model(model)
        version = self.client.create_model_version(
            model, source=f"revgate-route://{route}/{generation}",
            tags={"revgate.fingerprint": fingerprint, "revgate.decision": "served",
                  "revgate.run_id": ""},
            description=(f"Revision `{fingerprint}`, served by route {route} at generation {generation}; "
                         "no promotion run of it is in this ledger.\n"),
        )
        return str(version.version)

    def alias_target(self, model: str, alias: str) -> str | None:
        """The version ``alias`` names; None when the model or the alias does not exist."""
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version_by_alias(model, alias).version)
        except MlflowException:
            return None

    def alias_fingerprint(self, model: str, alias: str) -> str | None:
        """The revision the version ``alias`` names was registered for; None without one."""
        version = self.alias_target(model, alias)
        return None if version is None else self.version_fingerprint(model, version) or None

    def version_fingerprint(self, model: str, version: str) -> str:
        """The revision a version was registered for ("" when it names none)."""
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version(model, version).tags.get("revgate.fingerprint", ""))
        except MlflowException:
            return ""

    def set_route_status(self, model: str, version: str, status: str, decision: str | None = None) -> None:
        """Rewrite the version page's route-status line (and its decision tag, when given)."""
        from revgate.registry.follow import ROUTE_STATUS, with_route_status

        current = self.client.get_model_version(model, version)
        self.client.update_model_version(model, version, description=with_route_status(current.description, status))
        plain = status.removeprefix(ROUTE_STATUS).strip()
        self.client.set_model_version_tag(model, version, "revgate.route_status", plain)
        if decision is not None:
            self.client.set_model_version_tag(model, version, "revgate.decision", decision)

    def drop_alias(self, model: str, alias: str, *, by: str, generation: int) -> None:
        """Remove ``alias`` (a candidate whose rollout ended), recorded in the alias history like a move."""
        if self.alias_target(model, alias) is None:
            return
        self.client.delete_registered_model_alias(model, alias)
        self._record_alias_move(model, alias, None, by=by, generation=generation)

    def move_alias(self, model: str, alias: str, version: str, *, by: str, generation: int) -> None:
        """Point ``alias`` at ``version`` and append the move to the model's own alias history."""
        self.client.set_registered_model_alias(model, alias, version)
        self._record_alias_move(model, alias, version, by=by, generation=generation)

    def _record_alias_move(self, model: str, alias: str, version: str | None, *, by: str, generation: int) -> None:
        sequence = len(self.alias_history(model))  # tag keys allow no ':' or '+', so no timestamps
        entry = {"alias": alias, "version": version, "by": by, "route_generation": generation,
                 "at": datetime.now(UTC).isoformat(), "sequence": sequence}
        self.client.set_registered_model_tag(model, f"revgate.alias-history.{sequence:06d}", json.dumps(entry))

    def alias_history(self, model: str) -> list[dict[str, Any]]:
        """Every alias move recorded by :meth:`move_alias`, oldest first."""
        tags = self.client.get_registered_model(model).tags
        moves = [json.loads(value) for key, value in tags.items() if key.startswith("revgate.alias-history.")]
        return sorted(moves, key=lambda move: int(move["sequence"]))

    def route_of(self, candidate: str) -> str | None:
        """The route of a promotion run of the revision ``candidate`` (or starting so); None when there is none."""
        runs = self._runs_of(candidate, max_results=1)
        return str(runs[0].data.tags.get("revgate.route", "")) if runs else None

    def _runs_of(self, candidate: str, max_results: int = 1000) -> list[Any]:
        experiments = [e.experiment_id for e in self.client.search_experiments() if e.name.startswith("revgate/")]
        if not experiments:
            return []
        quoted = candidate.replace("'", "")
        return list(self.client.search_runs(experiments, filter_string=f"tags.`revgate.candidate` LIKE '{quoted}%'",
                                            max_results=max_results))

    def evidence_of(self, candidate: str, trusted: TrustedKeys | None = None,
                    controller: str | None = None) -> list[RunEvidence]:
        """Every promotion run of the revision whose fingerprint is or starts with ``candidate`` (signed approvals
        verified with the ``trusted`` keys, release decisions with the ``controller``'s public key, PEM text)."""
        return [self._run_evidence(run, trusted, controller) for run in self._runs_of(candidate)]

    def _run_evidence(self, run: Any, trusted: TrustedKeys | None = None,
                      controller: str | None = None) -> RunEvidence:
        tags: dict[str, str] = dict(run.data.tags)
        stored = self.evidence_files(run.info.run_id)
        approval = parse_approval(stored.get("approval"))
        facts = run_facts(run.info.run_id, tags, stored)
        checks = attestation_checks(stored, facts, controller)
        required, unattested = unattested_decision(facts, checks, controller)
        return RunEvidence(
            run_id=run.info.run_id,
            route=tags.get("revgate.route", ""),
            candidate=tags.get("revgate.candidate", ""),
            decision=tags.get("revgate.decision", ""),
            started_ms=int(run.info.start_time or 0),
            steps=recorded_steps(tags),
            documents=check_documents(recorded_digests(tags), stored.get),
            approval=approval,
            approved_report=report_for(approval, stored),
            approvals=approval_records(stored, trusted, route=tags.get("revgate.route", ""),
                                       flow_run_id=tags.get("prefect_flow_run_id", "")),
            attestations=checks, attestation_problems=required, unattested=unattested,
        )

    def evidence_files(self, run_id: str) -> dict[str, bytes]:
        """Every ``evidence/NAME.json`` of a run as stored now, by NAME, in one download."""
        from mlflow.exceptions import MlflowException

        with tempfile.TemporaryDirectory(prefix="revgate-audit-") as folder:
            try:
                local = Path(self.client.download_artifacts(run_id, "evidence", folder))
            except (MlflowException, OSError):
                return {}
            return {(path.name if attached(path.name) else path.stem): path.read_bytes()
                    for path in local.iterdir() if path.is_file() and (path.suffix == ".json" or attached(path.name))}

    def aliases_of(self, model: str, candidate: str) -> dict[str, str]:
        """Alias -> version for the registered model's versions of this revision (empty if none)."""
        from mlflow.exceptions import MlflowException

        try:
            registered = self.client.get_registered_model(model)
            versions = self.client.search_model_versions(f"name = '{model.replace(chr(39), '')}'")
        except MlflowException:
            return {}
        ours = {str(v.version) for v in versions if str(v.tags.get("revgate.fingerprint", "")).startswith(candidate)}
        return {alias: str(version) for alias, version in registered.aliases.items() if str(version) in ours}


TrustedKeys = Mapping[str, str]  # approver (casefolded) -> PEM public key, as the auditor gives them


def approval_records(
    stored: Mapping[str, bytes], trusted: TrustedKeys | None = None, *, route: str = "", flow_run_id: str = ""
) -> tuple[ApprovalRecord, ...]:
    """Every counted answer of a run, each signed one's signature verified again with the auditor's keys."""
    records = []
    for name in counted_approvals(stored):
        answer = parse_approval(stored[name]) or {}
        check = signature_audit(stored, name, answer, trusted, route=route, flow_run_id=flow_run_id)
        records.append(ApprovalRecord(name, answer, report_for(answer, stored), check))
    return tuple(records)


def signature_audit(
    stored: Mapping[str, bytes], name: str, answer: Mapping[str, Any], trusted: TrustedKeys | None = None, *,
    route: str = "", flow_run_id: str = "",
) -> SignatureAudit | None:
    """Re-verify the signature of the counted answer ``name`` over its stored statement with the key the auditor
    trusts for its approver (None: the answer was not signed).

    The key the run recorded is never used to verify: whoever can write to the run can record a key of their
    own beside a statement they signed with it. It is only compared with the trusted one.
    """
    statement, bundle = stored.get(f"{name}-statement"), stored.get(f"{name}-signature")
    signer = parse_approval(stored.get(f"{name}-signer"))
    if statement is None and bundle is None and signer is None:
        return None
    fingerprint = str((signer or {}).get("fingerprint", ""))
    if statement is None or bundle is None or signer is None:
        return SignatureAudit(fingerprint, False, "the statement, the signature or the signer's key is missing")
    approver = str(answer.get("approver", "")).strip()
    problem = _trusted_signature_problem(statement, bundle, fingerprint, approver, trusted or {})
    problem = problem or statement_problem(answer, statement, route, flow_run_id)
    return SignatureAudit(fingerprint, not problem, problem)


def _trusted_signature_problem(statement: bytes, bundle: bytes, fingerprint: str, approver: str,
                               trusted: TrustedKeys) -> str:
    """Why the signature does not verify with the key trusted for ``approver`` (empty: it does)."""
    key = trusted.get(approver.casefold())
    if key is None:
        return (f"no trusted key for {approver!r}: give it with --approver-key {approver!r}=FILE or --site "
                "(a key found in the run proves nothing)")
    from revgate.registry.signing import verify_approval  # sigstore: only where a signed approval is audited

    try:
        verified = verify_approval(statement, bundle.decode("utf-8", "replace"), key)
    except RevgateError as error:
        return f"{error.what} (checked with the key trusted for {approver!r})"
    if verified.fingerprint != fingerprint:
        return f"the run records key {fingerprint}, not the trusted {verified.fingerprint}"
    return ""


def run_facts(run_id: str, tags: Mapping[str, str], stored: Mapping[str, bytes]) -> RunFacts:
    """What the run holds now, hashed as stored (tagged or not): what a signed decision is checked against."""
    reports = {}
    for name in (name for name in stored if is_gate_report(name) and not attached(name)):
        try:
            reports[name] = str(json.loads(stored[name]).get("evidence_digest", ""))
        except (ValueError, AttributeError):
            reports[name] = ""
    return RunFacts(run_id=run_id, route=tags.get("revgate.route", ""), candidate=tags.get("revgate.candidate", ""),
                    flow_run_id=tags.get("prefect_flow_run_id", ""), decision=tags.get("revgate.decision", ""),
                    stored={name: sha256_digest(data) for name, data in stored.items()}, report_evidence=reports,
                    counted=tuple(counted_approvals(stored)))


def attestation_checks(stored: Mapping[str, bytes], facts: RunFacts,
                       controller: str | None) -> tuple[AttestationCheck, ...]:
    """Each signed decision of the run, verified with the auditor's controller key and held against the run."""
    names = attestation_names(stored)
    return tuple(attestation_check(name, stored[name], facts, controller, final=name == names[-1]) for name in names)


def attestation_check(name: str, envelope: bytes, facts: RunFacts, controller: str | None, *,
                      final: bool) -> AttestationCheck:
    """One signed decision: its signature with the trusted key (never a key found in the run), then its predicate."""
    where = f"the release attestation evidence/{name}.json of run {facts.run_id}"
    if controller is None:
        return AttestationCheck(name, "", "", 0, "", (
            f"{where} cannot be verified: no trusted controller key. Give the controller's public key with "
            "--controller-key FILE or --site (a key found in the run proves nothing).",))
    from revgate.registry.signing import verify_statement  # cryptography: only where a decision is audited

    try:
        verified = verify_statement(envelope.decode("utf-8", "replace"), controller, where=f"evidence/{name}.json")
        decision = parse_statement(verified.payload, where=f"evidence/{name}.json")
    except RevgateError as error:  # a signature that does not verify, a statement that is not a decision
        return AttestationCheck(name, "", "", 0, "", (f"{where} does not verify with the trusted controller key: "
                                                      f"{error.what}. {error.fix}",))
    problems = predicate_problems(decision, facts, where=where, final=final)
    return AttestationCheck(name, statement_digest(verified.payload), decision.decision, decision.generation,
                            verified.fingerprint, tuple(problems), decision)


def unattested_decision(facts: RunFacts, checks: tuple[AttestationCheck, ...],
                        controller: str | None) -> tuple[tuple[str, ...], str]:
    """For a decided run without a signed decision: the problem (an auditor who trusts a controller key expects
    every decision signed), or the note that says it is the run's word only."""
    if checks or facts.decision not in DECISIONS:
        return (), ""
    if controller is not None:
        return (f"run {facts.run_id} is tagged decision {facts.decision} but holds no release attestation "
                f"(evidence/release-attestation.json): it was deleted, or the controller signed nothing. Restore it "
                "from a backup of the artifact store, or give the route a controller_key_file; until then the "
                "decision is unproven.",), ""
    return (), ("no controller key given (--controller-key FILE or --site) and the run holds no signed decision: the "
                "decision is the run's own word")
