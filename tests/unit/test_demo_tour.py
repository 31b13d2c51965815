"""The demo's tour: the `revgate status` command it prints is complete, so no row says "not configured"."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from revgate.cli.main import build_parser
from revgate.flows.demo import Tour, print_tour


def test_the_printed_status_command_names_every_part_it_reports_on(capsys: pytest.CaptureFixture[str]) -> None:
    # The defect: the command left out the tracking URI and the Prefect API: three rows said "not configured".
    tour = Tour("http://127.0.0.1:4200", Path("/state/prefect-auth"), "", "http://127.0.0.1:5000", "demo-model",
                "http://127.0.0.1:8000", "http://127.0.0.1:8001", "/state/routes", Path("/state/token"),
                "http://127.0.0.1:8701", "sqlite:////state/mlflow.db", "http://127.0.0.1:4200/api")
    print_tour(tour)
    lines = capsys.readouterr().out.splitlines()
    start = next(index for index, line in enumerate(lines) if "PREFECT_API_AUTH_STRING" in line)
    command = " ".join(line.strip().removesuffix("\\") for line in lines[start:start + 4])
    words = shlex.split(command)
    assert words[0] == 'PREFECT_API_AUTH_STRING=$(cat /state/prefect-auth)' and words[1] == "revgate"
    args = build_parser().parse_args(words[2:])
    assert (args.tracking_uri, args.prefect_api) == ("sqlite:////state/mlflow.db", "http://127.0.0.1:4200/api")
    assert args.router == ["http://127.0.0.1:8001"] and args.worker == ["http://127.0.0.1:8701"]
    assert args.routes == "/state/routes" and args.mlflow_ui == "http://127.0.0.1:5000"
