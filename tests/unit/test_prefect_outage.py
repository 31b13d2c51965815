"""Which errors from Prefect's client mean the API is away (wait it out) and which mean a wrong request (raise)."""

from __future__ import annotations

import httpx
import pytest
from prefect.exceptions import PrefectHTTPStatusError

from revgate.flows.outage import prefect_unreachable

URL = "http://prefect.example/api/flow_runs/1"


def status_error(code: int) -> PrefectHTTPStatusError:
    request = httpx.Request("GET", URL)
    return PrefectHTTPStatusError.from_httpx_error(
        httpx.HTTPStatusError("answered", request=request, response=httpx.Response(code, request=request)))


@pytest.mark.parametrize("error", [httpx.ConnectError("refused"), httpx.ReadTimeout("no answer"),
                                   httpx.RemoteProtocolError("closed mid-answer"), status_error(503),
                                   status_error(502)])
def test_no_answer_or_a_gateways_5xx_is_prefect_away(error: Exception) -> None:
    assert prefect_unreachable(error)


@pytest.mark.parametrize("error", [status_error(404), status_error(410), status_error(422), ValueError("bad"),
                                   RuntimeError("Flow run cannot be paused")])
def test_a_wrong_request_or_a_bug_is_not_an_outage(error: Exception) -> None:
    assert not prefect_unreachable(error)
