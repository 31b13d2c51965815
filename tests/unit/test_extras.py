"""Each host installs only its part: every library the package imports belongs to the bare install or
to an extra, and a command whose extra is missing names the pip command that adds it."""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from importlib import metadata

import pytest

from revgate.cli import main as cli_main
from revgate.cli.extras import DISTRIBUTION_OF, extras_providing, missing_extra
from tests import package_view
from tests.conftest import ROOT

LIGHT_HOSTS = {"router": ("prefect", "mlflow", "scipy", "torch", "transformers", "uvicorn", "model-signing"),
               "worker": ("prefect", "mlflow", "scipy", "torch", "transformers", "matplotlib")}


def project() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def name_of(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!;\[~]", requirement, maxsplit=1)[0]).lower()


def imported_libraries() -> dict[str, set[str]]:
    """Every third-party top-level import in the package, with the subpackages that import it."""
    found: dict[str, set[str]] = {}
    for name, folder in package_view.package_dirs().items():
        for file in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for module in modules:
                    top = module.partition(".")[0]
                    if top not in sys.stdlib_module_names and top != "revgate":
                        found.setdefault(top, set()).add(name)
    return found


def test_every_library_the_package_imports_is_declared_by_the_bare_install_or_an_extra() -> None:
    declared = {name_of(r) for r in project()["dependencies"]}  # type: ignore[attr-defined]
    for extra, requirements in project()["optional-dependencies"].items():  # type: ignore[attr-defined]
        if extra != "dev":
            declared |= {name_of(r) for r in requirements}
    imported = imported_libraries()
    assert {"prefect", "httptools", "torch", "pydantic"} <= set(imported)
    undeclared = {module: sorted(users) for module, users in imported.items()
                  if name_of(DISTRIBUTION_OF.get(module, module)) not in declared}
    assert not undeclared, f"imported but in no extra of pyproject.toml: {undeclared}"


def test_the_light_hosts_extras_leave_out_the_control_plane() -> None:
    extras = project()["optional-dependencies"]
    base = {name_of(r) for r in project()["dependencies"]}  # type: ignore[attr-defined]
    for host, absent in LIGHT_HOSTS.items():
        installed = base | {name_of(r) for r in extras[host]}  # type: ignore[index]
        assert not installed & set(absent), (host, installed & set(absent))
    assert {"prefect", "mlflow", "scipy"} <= {name_of(r) for r in extras["control"]}  # type: ignore[index]
    assert "torch" in {name_of(r) for r in extras["zoo"]}  # type: ignore[index]


def test_a_missing_library_is_named_with_the_extra_of_the_command_that_needs_it() -> None:
    requirements = metadata.requires("revgate") or []
    assert extras_providing(requirements, "prefect") == ["control"]
    assert extras_providing(requirements, "model_signing") == ["control", "worker"]
    assert extras_providing(requirements, "pytest") == []  # dev tools are no host's part
    worker = missing_extra(ModuleNotFoundError(name="model_signing.signing"), "worker")
    assert worker is not None and 'pip install "revgate[worker]"' in str(worker)
    promote = missing_extra(ModuleNotFoundError(name="model_signing"), "promote")
    assert promote is not None and 'pip install "revgate[control]"' in str(promote)
    assert missing_extra(ModuleNotFoundError(name="revgate.nowhere"), "promote") is None


def test_the_command_line_says_which_extra_to_install_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def parser_whose_command_lacks(module: str) -> argparse.ArgumentParser:
        def run(args: argparse.Namespace) -> int:
            raise ModuleNotFoundError(f"No module named '{module}'", name=module)

        parser = argparse.ArgumentParser()
        parser.set_defaults(func=run, command="deploy")
        return parser

    monkeypatch.setattr(cli_main, "build_parser", lambda: parser_whose_command_lacks("prefect"))
    assert cli_main.main([]) == 2
    error = capsys.readouterr().err
    assert "`revgate deploy` needs prefect" in error and 'pip install "revgate[control]"' in error
    # A module of revgate's own that is missing is a bug, not an extra: it is raised as it is.
    monkeypatch.setattr(cli_main, "build_parser", lambda: parser_whose_command_lacks("revgate.nowhere"))
    with pytest.raises(ModuleNotFoundError, match=r"revgate\.nowhere"):
        cli_main.main([])
