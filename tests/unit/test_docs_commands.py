"""Every command the docs show is run by a test.

The docs are README.md and docs/*.md. A command is a line of a fenced code block, at the block's
left margin, whose first word (after ``NAME=value`` settings) is one of COMMAND_WORDS; a line
ending in a backslash, or one with an unclosed ``[`` or ``(``, goes on on the next line. Indented
lines and other lines, lines laid out in columns (runs of spaces) and other lines are output, JSON or
configuration. Commands named in prose (inline code) are not collected.

For each command: a ``revgate`` command (also as ``.venv/bin/revgate`` or ``.venv/bin/python -m
revgate.cli.main``) parses with the real argument parser (cli.main.build_parser, nothing executed); a
synopsis (``[optional]``, ``(one | other)``, ``<placeholder>``) parses in each of its forms. And
the command is in RUN_BY: the tests that run it, each a node id whose file and function exist,
or DocumentedOnly with the reason no test here can run it. A new command in the docs without an
entry fails with the doc, the line and the command.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from revgate.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
COMMAND_WORDS = frozenset({"revgate", "make", "prefect", "mlflow", "curl", "openssl", "git", "python", "python3",
                           "pip", "docker", "kubectl"})
FENCE = re.compile(r"^(\s*)(```|~~~)")
SETTING = re.compile(r"^[A-Z_][A-Z0-9_]*=")
PLACEHOLDER = re.compile(r"<[^<>]*>")
COLUMNS = re.compile(r"\S {2,}\S")  # output lays out columns with runs of spaces; a command has none


@dataclass(frozen=True)
class DocumentedOnly:
    """A command no test here can run (a production setup, the suite itself); ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class Shown:
    """A command as a doc shows it."""

    doc: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


ARTIFACTS = "tests/integration/test_cli_artifacts.py"
ENGINEER = "tests/integration/test_engineer_guide_commands.py"
GUIDE = f"{ENGINEER}::test_the_engineer_guide_publishes_a_revision_as_shown"
FOLLOW = f"{ENGINEER}::test_the_engineer_guide_follows_and_rolls_back_a_canary_as_shown"
DEPLOYMENTS = "tests/integration/test_deployments.py"
DEMO = "tests/integration/test_promotion_demo.py"
# `revgate demo` as typed: approved on the Prefect UI's Resume form, promoted, up for its tour until Ctrl-C.
DEMO_UP = f"{DEMO}::test_an_improved_revision_approved_on_the_resume_form_is_promoted_and_the_demo_stays_up"
# The demo's other candidates: the same session set-up and rollout `revgate demo` runs (demo_session,
# DemoSession.rollout), one shared session for all of them.
DEMO_ROLLOUTS = "tests/integration/test_demo_rollouts.py"
STATUS = "tests/integration/test_status.py"
MAKE = "tests/unit/test_docs_commands.py::test_the_make_targets_the_docs_name_exist_and_run_revgate"
SIGNED_APPROVAL = "tests/integration/test_signed_approval.py"
ATTESTATION = "tests/integration/test_release_attestation.py"
PACKAGING = "tests/integration/test_packaging.py"
LIGHT_HOSTS = (f"{PACKAGING}::test_a_router_and_a_worker_agent_serve_from_their_light_environments",
               f"{PACKAGING}::test_the_light_hosts_carry_no_control_plane_and_the_control_host_no_zoo")

# Command text (as shown, continuation lines joined, comment dropped) -> the tests that run it.
RUN_BY: dict[str, tuple[str, ...] | DocumentedOnly] = {
    # README.md, docs/quickstart.md
    "make demo": (DEMO_UP, MAKE),
    "make test": DocumentedOnly("runs the whole suite, this test among them; CI runs it. The target is checked by "
                                "test_the_make_targets_the_docs_name_exist_and_run_revgate"),
    "git clone <this repository> revgate && cd revgate": DocumentedOnly(
        "a fresh clone of the repository from its host; the tests run in a checkout"),
    ".venv/bin/revgate demo --exit": (
        DEMO_UP, f"{DEMO_ROLLOUTS}::test_a_revision_identical_to_stable_is_promoted_by_the_demos_plan"),
    ".venv/bin/revgate demo --candidate slice-regressed --exit": (
        f"{DEMO_ROLLOUTS}::test_a_slice_regression_is_caught_and_rolled_back",),
    ".venv/bin/revgate demo --candidate slow --exit": (
        f"{DEMO_ROLLOUTS}::test_a_slower_revision_is_rolled_back_by_a_latency_or_slo_gate",),
    ".venv/bin/revgate demo --approval ui": (DEMO_UP,),
    # docs/artifacts.md (synopsis)
    "revgate manifest build DIR -o manifest.json [--base sha256:...]": (
        f"{ARTIFACTS}::test_build_sign_verify_with_key",
        "tests/integration/test_registry_pipeline.py"),
    "revgate sign DIR --key KEY.pem [--cert LEAF.crt --chain INT.pem] [--manifest manifest.json] -o SIG": (
        f"{ARTIFACTS}::test_build_sign_verify_with_key",
        f"{ARTIFACTS}::test_sign_with_certificate_and_verify_with_chain"),
    "revgate verify DIR --signature SIG (--key PUB.pem | --chain CA.pem [--chain INT.pem] "
    "| --identity ID --issuer URL) [--manifest manifest.json]": (
        f"{ARTIFACTS}::test_build_sign_verify_with_key",
        f"{ARTIFACTS}::test_sign_with_certificate_and_verify_with_chain",
        f"{ARTIFACTS}::test_verify_keyless_identity"),
    "revgate push DIR STORE_URL [--signature SIG] [--manifest manifest.json]": (
        f"{ARTIFACTS}::test_push_and_pull_local_store",
        f"{ARTIFACTS}::test_a_single_file_signed_by_model_signing_verifies_and_travels"),
    "revgate pull sha256:<manifest digest> STORE_URL DEST [--signature-out SIG]": (
        f"{ARTIFACTS}::test_push_and_pull_local_store", f"{ARTIFACTS}::test_push_and_pull_through_s3"),
    # docs/engineer.md
    "openssl ecparam -name prime256v1 -genkey -noout -out key.pem": (GUIDE,),
    "openssl ec -in key.pem -pubout -out key.pub": (GUIDE,),
    "revgate manifest build improved -o improved.manifest.json": (GUIDE,),
    "revgate sign improved --key key.pem --manifest improved.manifest.json -o improved.sig": (GUIDE,),
    "revgate verify improved --signature improved.sig --key key.pub --manifest improved.manifest.json": (GUIDE,),
    "revgate push improved /srv/artifacts --signature improved.sig --manifest improved.manifest.json": (GUIDE,),
    "revgate promote chat improved --plan careful --requested-by ana": (
        "tests/integration/test_deployment_rollout.py::"
        "test_a_rollout_asked_for_by_name_is_approved_in_the_ui_and_promoted_by_the_worker",
        f"{DEPLOYMENTS}::test_an_unknown_name_names_what_the_site_has"),
    "revgate status chat --routes /srv/routes": (FOLLOW, f"{STATUS}::test_plain_output_and_watch"),
    "revgate rollback --routes /srv/routes --route chat --created-by ana --dry-run": (
        FOLLOW, "tests/integration/test_rollback_cli.py::test_rollback_reverts_the_last_promotion_atomically"),
    "revgate rollback --routes /srv/routes --route chat --created-by ana --notify http://router:8081 "
    "--admin-token-file router.token": (
        "tests/integration/test_rollback_cli.py::test_rollback_tells_the_routers_it_knows_and_the_others_poll_it_in",),
    # docs/gates.md
    "revgate trace trace.jsonl --requests 2000 --rate 20 --arrivals bursty --labelled 0.3 --mix sort/long=2": (
        "tests/unit/test_cli_evaluate.py::test_trace_command_writes_a_readable_trace",),
    "revgate replay trace.jsonl --target http://127.0.0.1:8000/v1 --out records.jsonl": (
        "tests/integration/test_replay.py::test_replay_command_writes_records_and_prints_a_summary",),
    "revgate gate records.jsonl --policy policy.json --out report.json --plots evidence/ [--final]": (
        "tests/unit/test_cli_evaluate.py::test_gate_command_fails_a_regressed_slice_and_writes_report_and_plots",),
    # docs/models.md
    "revgate models make .cache/zoo": (
        "tests/integration/test_zoo.py::test_models_make_is_deterministic_and_reuses_its_cache",),
    "revgate models eval .cache/zoo --markdown": (
        "tests/integration/test_models_eval_cli.py::"
        "test_models_eval_serves_a_revision_measures_it_and_prints_the_docs_table",),
    # docs/operations.md
    "revgate status chat --routes .cache/routes --router http://127.0.0.1:8081 --router-token-file router.token "
    "--worker http://127.0.0.1:9000 --worker-token-file worker.token --tracking-uri sqlite:///.cache/mlflow.db "
    "--mlflow-ui http://127.0.0.1:5000 --prefect-api http://127.0.0.1:4200/api": (
        f"{STATUS}::test_status_json_before_during_and_after_a_route_change",),
    "revgate status chat --routes .cache/routes --json --watch 0.05 --rounds 2": (
        f"{STATUS}::test_plain_output_and_watch",),
    "revgate evidence sha256:5555 --tracking-uri sqlite:///.cache/mlflow.db --model chat-model": (
        "tests/integration/test_ledger.py::test_an_auditor_traces_a_revision_and_finds_its_evidence_intact",),
    "PREFECT_API_URL=http://prefect.internal:4200/api revgate deploy": (
        f"{DEPLOYMENTS}::test_the_run_form_is_typed_and_described",),
    "REVGATE_HOME=$PWD REVGATE_SITE=/etc/revgate/site.json PREFECT_API_URL=http://prefect.internal:4200/api "
    "prefect worker start --pool revgate": (
        f"{DEPLOYMENTS}::test_a_refused_route_and_a_missing_candidate_each_end_with_their_reason",),
    "revgate promote alpha tiny": (
        f"{DEPLOYMENTS}::test_a_refused_route_and_a_missing_candidate_each_end_with_their_reason",),
    "revgate promote beta sha256:9999999999999999999999999999999999999999999999999999999999999999 --policy default "
    "--plan half": (f"{DEPLOYMENTS}::test_a_refused_route_and_a_missing_candidate_each_end_with_their_reason",),
    "revgate promote deployed improved --requested-by ana": (
        "tests/integration/test_deployment_rollout.py::"
        "test_a_rollout_asked_for_by_name_is_approved_in_the_ui_and_promoted_by_the_worker",),
    "prefect deployment run rollback/rollback-route --param route=beta --param requested_by=oncall --watch": (
        f"{DEPLOYMENTS}::test_the_rollback_deployment_removes_the_canary",),
    "revgate router-key /etc/revgate/router-a.key": (
        "tests/integration/test_record_sink.py::test_a_forged_object_in_the_store_is_refused_reported_and_holds_no_stage",),
    # docs/worker.md
    "revgate worker --host 127.0.0.1 --port 8701 --cache .cache/worker --token-file worker.token": (
        "tests/integration/test_worker_agent.py::test_replicas_start_verified_warm_serve_die_loudly_refuse_tampering_and_drain",),
    # docs/promotion.md
    "revgate gc --routes s3://routes/prod --worker http://gpu-1:8700 --worker http://gpu-2:8700 "
    "--token-file worker.token": (
        "tests/integration/test_rollout_faults.py::test_a_killed_controller_leaves_stable_serving_within_one_lease",),
    # docs/fleet.md, README.md: the wheel of this checkout, installed with each extra
    'pip install "revgate[router]"': LIGHT_HOSTS,
    'pip install "revgate[worker]"': LIGHT_HOSTS,
    'pip install "revgate[control]"': (f"{PACKAGING}::test_promote_runs_from_the_control_extra",),
    "pip install revgate": (f"{PACKAGING}::test_a_command_from_a_host_without_its_extra_names_the_pip_command",
                            f"{PACKAGING}::test_the_wheel_and_every_install_add_one_import_name"),
    # docs/auditor.md
    "revgate evidence sha256:5555 --tracking-uri sqlite:///.cache/demo/mlflow.db --model chat": (
        "tests/integration/test_ledger.py::test_an_auditor_traces_a_revision_and_finds_its_evidence_intact",),
    "revgate evidence sha256:5555 --tracking-uri sqlite:///.cache/demo/mlflow.db --approver-key "
    "alice@example.com=keys/alice.pub --approver-key bob=keys/bob.pub": (
        "tests/integration/test_signed_approval.py::test_only_an_answer_signed_with_the_named_approvers_key_decides",),
    "revgate evidence sha256:2222 --tracking-uri sqlite:///.cache/demo/mlflow.db --routes .cache/demo/routes": (
        "tests/integration/test_registry_follows_route.py::"
        "test_a_rollback_moves_the_stable_alias_and_both_version_pages_say_where_they_stand",),
    "revgate evidence sha256:2222 --tracking-uri sqlite:///.cache/demo/mlflow.db --routes .cache/demo/routes "
    "--controller-key .cache/demo/keys/controller.pub --approver-key alice=keys/alice.pub": (
        f"{ATTESTATION}::test_the_promotion_signs_its_decision_and_the_route_records_it",),
    "revgate evidence sha256:2222 --tracking-uri sqlite:///.cache/demo/mlflow.db --site revgate-site.json": (
        "tests/unit/test_site.py::test_an_auditor_trusts_the_sites_approver_keys_and_its_own_first",),
}

# Commands of a kind covered by the same tests, whatever their arguments: `revgate approve` (approving and
# rejecting, with the signer's key and name) in docs/release-manager.md and docs/auditor.md.
RUN_BY_PREFIX: dict[str, tuple[str, ...]] = {
    "revgate approve": (f"{SIGNED_APPROVAL}::test_only_an_answer_signed_with_the_named_approvers_key_decides",
                        f"{SIGNED_APPROVAL}::"
                        "test_a_second_counted_answer_is_kept_beside_the_first_and_a_wrong_run_or_state_is_refused"),
}


def fenced_blocks(text: str) -> Iterator[tuple[int, int, list[str]]]:
    """(first line number, fence indent, lines) of each fenced code block."""
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        opened = FENCE.match(lines[number])
        number += 1
        if not opened:
            continue
        indent, marker, start, body = len(opened.group(1)), opened.group(2), number + 1, []
        while number < len(lines) and not lines[number].strip().startswith(marker):
            body.append(lines[number])
            number += 1
        number += 1
        yield start, indent, body


def unbalanced(text: str) -> bool:
    return text.count("[") > text.count("]") or text.count("(") > text.count(")")


def without_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` after whitespace, outside quotes)."""
    quote = ""
    for position, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and position > 0 and line[position - 1].isspace():
            return line[:position].rstrip()
    return line.rstrip()


def program(text: str) -> str:
    """The command's program word: settings skipped, ``.venv/bin/`` dropped, ``-m revgate.cli.main`` is revgate."""
    words = PLACEHOLDER.sub("X", text).split()
    while words and SETTING.match(words[0]):
        words = words[1:]
    if not words:
        return ""
    word = words[0].removeprefix(".venv/bin/")
    if word in ("python", "python3") and words[1:3] == ["-m", "revgate.cli.main"]:
        return "revgate"
    return word


def commands_in(doc: Path) -> Iterator[Shown]:
    name = doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else doc.name
    for start, indent, body in fenced_blocks(doc.read_text(encoding="utf-8")):
        number = 0
        while number < len(body):
            line, first = body[number], start + number
            number += 1
            if line[indent:indent + 1].isspace():
                continue  # indented: output
            text = without_comment(line)
            while text.endswith("\\") and number < len(body):
                text = text.removesuffix("\\").rstrip() + " " + without_comment(body[number]).strip()
                number += 1
            if program(text) not in COMMAND_WORDS or COLUMNS.search(text):
                continue  # not a command, or output in columns (`mlflow run  not configured`)
            while unbalanced(text) and number < len(body):
                text = text + " " + without_comment(body[number]).strip()
                number += 1
            yield Shown(name, first, " ".join(text.split()))


def shown_commands() -> list[Shown]:
    return [command for doc in DOCS for command in commands_in(doc)]


def closing(words: list[str]) -> int:
    """The index of the bracket that closes the one ``words`` opens with."""
    depth = 0
    for index, word in enumerate(words):
        depth += (word in ("[", "(")) - (word in ("]", ")"))
        if depth == 0:
            return index
    raise AssertionError(f"unclosed bracket in {' '.join(words)}")


def forms(words: list[str]) -> Iterator[list[str]]:
    """Each form of a synopsis: every ``[optional]`` part left out and put in, each ``(a | b)`` alternative."""
    if not words:
        yield []
        return
    head, rest = words[0], words[1:]
    if head in ("[", "("):
        end = closing(words)
        inner, after = words[1:end], words[end + 1:]
        choices: list[list[str]] = [[]]
        for word_at, word in enumerate(inner):
            nested = sum(w in ("[", "(") for w in inner[:word_at]) - sum(w in ("]", ")") for w in inner[:word_at])
            if word == "|" and nested == 0:
                choices.append([])
            else:
                choices[-1].append(word)
        options = ([[]] if head == "[" else []) + choices
        for option, tail in itertools.product(options, list(forms(after))):
            for inner_form in forms(option):
                yield inner_form + tail
        return
    for tail in forms(rest):
        yield [head, *tail]


def revgate_argv(text: str) -> list[str]:
    """The revgate arguments of a command line; brackets and bars split off as words of their own."""
    spaced = re.sub(r"([\[\]()|])", r" \1 ", PLACEHOLDER.sub("PLACEHOLDER", text))
    words = shlex.split(spaced)
    while SETTING.match(words[0]):
        words = words[1:]
    if words[0].removeprefix(".venv/bin/") in ("python", "python3"):
        words = words[2:]  # -m revgate.cli.main
    return words[1:]


def parses(argv: list[str]) -> str:
    """'' when the real parser accepts ``argv``, else what it said."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exit_:
            return said.getvalue().strip() or f"exit {exit_.code}"
    return ""


def covering(text: str) -> tuple[str, ...] | DocumentedOnly | None:
    if text in RUN_BY:
        return RUN_BY[text]
    for prefix, tests in RUN_BY_PREFIX.items():
        if text == prefix or text.startswith(prefix + " "):
            return tests
    return None


def test_the_docs_show_commands_and_the_collector_finds_them() -> None:
    shown = shown_commands()
    texts = {command.text for command in shown}
    assert "make demo" in texts
    assert "revgate status chat --routes .cache/routes --json --watch 0.05 --rounds 2" in texts  # comment-free
    assert any(text.startswith("revgate status chat --routes .cache/routes --router") for text in texts)  # joined
    assert not any(text.startswith(("run ", "route ", "flow run")) for text in texts)  # output is not a command


def test_a_new_command_is_found_named_by_doc_and_line_and_a_wrong_one_does_not_parse(tmp_path: Path) -> None:
    doc = tmp_path / "new.md"
    doc.write_text("Text.\n\n```\nrevgate status chat --routes R \\\n    --no-such-flag   # why\nroute chat  ok\n"
                   "```\n\n```json\n{\"revgate\": 1}\n```\n", encoding="utf-8")
    (found,) = commands_in(doc)
    assert found == Shown("new.md", 4, "revgate status chat --routes R --no-such-flag")
    assert covering(found.text) is None
    assert "--no-such-flag" in parses(revgate_argv(found.text))
    assert not parses(revgate_argv("revgate status chat --routes R"))
    assert [" ".join(f) for f in forms(revgate_argv("revgate pull D S <dest dir> [--signature-out X] (--a | --b)"))] \
        == ["pull D S PLACEHOLDER --a", "pull D S PLACEHOLDER --b", "pull D S PLACEHOLDER --signature-out X --a",
            "pull D S PLACEHOLDER --signature-out X --b"]


@pytest.mark.parametrize("command", [c for c in shown_commands() if program(c.text) == "revgate"],
                         ids=lambda c: f"{c.doc}:{c.line}")
def test_each_revgate_command_parses_with_the_real_parser(command: Shown) -> None:
    for form in forms(revgate_argv(command.text)):
        said = parses(form)
        assert not said, f"{command.where()}\n  this form does not parse: revgate {' '.join(form)}\n  {said}"


def test_every_command_shown_is_run_by_a_test_or_says_why_not() -> None:
    missing = [command.where() for command in shown_commands() if covering(command.text) is None]
    assert not missing, (
        "commands in the docs that no test runs: add them to RUN_BY in tests/unit/test_docs_commands.py with the "
        "test that runs each (or DocumentedOnly and why none can):\n  " + "\n  ".join(missing))


def test_no_entry_outlives_its_command() -> None:
    shown = {command.text for command in shown_commands()}
    stale = sorted(set(RUN_BY) - shown)
    assert not stale, f"RUN_BY names commands no doc shows any more: {stale}"


def defined_tests(path: Path) -> set[str]:
    """``name`` and ``Class::name`` of each test function in a test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{item.name}" for item in node.body
                      if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)}
    return names


def test_every_test_named_exists() -> None:
    named = {test for tests in (*RUN_BY.values(), *RUN_BY_PREFIX.values()) if isinstance(tests, tuple)
             for test in tests}
    wrong = []
    for node in sorted(named):
        path, _, function = node.partition("::")
        if not (ROOT / path).is_file():
            wrong.append(f"{node}: no file {path}")
        elif function and function not in defined_tests(ROOT / path):
            wrong.append(f"{node}: {path} defines no test {function}")
    assert not wrong, "\n".join(wrong)


def test_documented_only_commands_are_few_and_say_why() -> None:
    only = {text: entry for text, entry in RUN_BY.items() if isinstance(entry, DocumentedOnly)}
    assert len(only) <= 4, only
    assert all(len(entry.reason) > 40 for entry in only.values()), only


def make_targets() -> dict[str, list[str]]:
    """Each Makefile target's recipe lines."""
    targets: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        if line.startswith("\t"):
            current.append(line.strip())
        elif (found := re.match(r"^([a-z][a-z-]*):", line)) is not None:
            current = targets.setdefault(found.group(1), [])
    return targets


def test_the_make_targets_the_docs_name_exist_and_run_revgate() -> None:
    targets = make_targets()
    named = {c.text.split()[1] for c in shown_commands() if c.text.startswith("make ")}
    assert named <= set(targets), f"make targets the docs show that the Makefile lacks: {named - set(targets)}"
    assert targets["demo"] == ["$(PY) -m revgate.cli.main demo"]  # `make demo` is `revgate demo` after setup
    assert targets["test"] == ["bash .ci/test"]
    # `make test` runs every test under tests/: the unit tests, then the integration tests in runs
    # whose selections together are all of them: the engine tests not gated (split by file into two
    # runs), the gated rollouts, and the tests that start no engine.
    script = (ROOT / ".ci" / "test").read_text(encoding="utf-8")
    assert '"$PY" -m pytest -q tests/unit\n' in script
    assert 'STREAMED=("${FIRST_LANE[@]}" -m "engine and not gated")\n' in script
    assert 'BESIDE=(tests/integration -m "engine and not gated")\n' in script
    assert 'for f in "${FIRST_LANE[@]}"; do BESIDE+=("--ignore=$f"); done\n' in script
    assert 'STREAMED=(tests/integration -m gated)\n' in script
    assert 'BESIDE=(tests/integration -m "not engine")\n' in script
    assert {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"} <= {
        "unit", "integration", "data"}, "a test folder `make test` does not run"


def test_the_revgate_program_the_docs_run_is_this_parser() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    # `.venv/bin/revgate` and `python -m revgate.cli.main` are build_parser's
    assert scripts["revgate"] == "revgate.cli.main:main"
