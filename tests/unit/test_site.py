"""The site configuration turns a person's names (route, candidate, policy, plan) into a full promotion spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from revgate.flows.site import ROUTE_ONLY, RouteSite, SiteConfigInvalid, load_site, promotion_spec, site_path
from revgate.flows.spec import PromotionSpec
from revgate.manifests.gates import GatePolicy
from revgate.manifests.rollout import Approve, Bake, RolloutPlan, SetWeight

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def route_settings(**changes: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "artifact_store": "/srv/artifacts", "route_store": "s3://routes/prod",
        "signature": {"kind": "key", "public_key": "/etc/revgate/publisher.pub"},
        "worker_url": "http://gpu-1:9000", "worker_token_file": "/etc/revgate/worker.token",
        "router_url": "http://router:8080", "router_admin_url": "http://router:8081",
        "router_admin_token_file": "/etc/revgate/router.token", "records_sink": "s3://records/prod",
        "trace": "/srv/traces/chat.jsonl", "tracking_uri": "http://mlflow:5000", "evidence_root": "/srv/evidence",
        "policy": "strict", "plan": "ladder", "candidates": {"improved": DIGEST},
    }
    return {**settings, **changes}


def site_json(**route_changes: Any) -> dict[str, Any]:
    strict = GatePolicy.build(slice_keys=["family"], max_samples_per_stage=300, look_every=50, quality_margin="0.05")
    ladder = RolloutPlan.build(steps=[SetWeight(weight_ppm=50_000), Bake(seconds=60)])
    quick = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)])
    return {
        "routes": {"chat": route_settings(**route_changes)},
        "policies": {"strict": strict.model_dump(mode="json"), "lenient": GatePolicy().model_dump(mode="json")},
        "plans": {"ladder": ladder.model_dump(mode="json"), "quick": quick.model_dump(mode="json")},
    }


def write_site(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "site.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_route_settings_are_promotion_spec_fields() -> None:
    assert set(RouteSite.model_fields) - ROUTE_ONLY <= set(PromotionSpec.model_fields)


def test_names_become_the_spec_with_the_route_defaults(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path, site_json(approval="auto")))
    spec = promotion_spec(site, "chat", "improved", created_by="ana")
    assert spec.candidate_manifest == DIGEST and spec.candidate_name == "improved"
    assert spec.gate_policy == site.policies["strict"] and spec.plan == site.plans["ladder"]
    assert spec.route == "chat" and spec.approval == "auto" and spec.created_by == "ana"
    assert spec.worker_url == "http://gpu-1:9000" and spec.records_sink == "s3://records/prod"
    assert spec.probe_concurrency == 4
    paced = load_site(write_site(tmp_path, site_json(probe_concurrency=8)))
    assert promotion_spec(paced, "chat", "improved").probe_concurrency == 8


def test_a_fleet_on_an_s3_route_store_becomes_the_spec(tmp_path: Path) -> None:
    routes = "s3://routes/prod?endpoint_url=http://s3.internal:9000"
    document = site_json(route_store=routes, more_workers=["http://gpu-2:9000/"], router_sync_s=45,
                         more_routers=["http://router-b:8081", "http://router:8081"])
    document["plans"]["spread"] = RolloutPlan.build(steps=[SetWeight(weight_ppm=500_000)],
                                                    candidate_replicas=2).model_dump(mode="json")
    site = load_site(write_site(tmp_path, document))
    spec = promotion_spec(site, "chat", "improved", plan="spread")
    assert spec.route_store == routes and spec.plan.candidate_replicas == 2 and spec.router_sync_s == 45
    assert spec.workers() == ("http://gpu-1:9000", "http://gpu-2:9000")
    assert spec.routers() == ("http://router:8081", "http://router-b:8081")  # each router once
    with pytest.raises(SiteConfigInvalid) as bad:
        load_site(write_site(tmp_path, site_json(router_sync_s=0)))
    assert "routes.chat.router_sync_s" in str(bad.value)


def test_a_named_policy_and_plan_and_a_digest_candidate(tmp_path: Path) -> None:
    site = load_site(write_site(tmp_path, site_json()))
    spec = promotion_spec(site, "chat", OTHER, policy="lenient", plan="quick")
    assert spec.candidate_manifest == OTHER and spec.candidate_name == ""
    assert spec.gate_policy == GatePolicy() and spec.plan == site.plans["quick"]
    assert promotion_spec(site, "chat", DIGEST).candidate_name == "improved"  # a listed digest keeps its name


@pytest.mark.parametrize(("choice", "named"), [
    ({"route": "mail"}, "no route named 'mail'"),
    ({"candidate": "unknown"}, "no candidate named 'unknown'"),
    ({"policy": "loose"}, "no gate policy named 'loose'"),
    ({"plan": "slow"}, "no rollout plan named 'slow'"),
])
def test_an_unknown_name_is_refused_with_the_names_known(tmp_path: Path, choice: dict[str, str], named: str) -> None:
    site = load_site(write_site(tmp_path, site_json()))
    chosen = {"route": "chat", "candidate": "improved", "policy": "", "plan": "", **choice}
    with pytest.raises(SiteConfigInvalid) as refused:
        promotion_spec(site, chosen["route"], chosen["candidate"], policy=chosen["policy"], plan=chosen["plan"])
    assert named in str(refused.value)
    assert "Name one the site configuration has:" in str(refused.value)


def test_automatic_approval_is_the_sites_and_never_skips_named_approvers(tmp_path: Path) -> None:
    assert promotion_spec(load_site(write_site(tmp_path, site_json())), "chat", "improved").approval == "ui"
    document = site_json(approval="auto")
    gated = RolloutPlan.build(steps=[SetWeight(weight_ppm=50_000), Approve()], approvers=("rm",))
    document["plans"]["gated"] = gated.model_dump(mode="json")  # (signed approvals need approvers too)
    site = load_site(write_site(tmp_path, document))
    with pytest.raises(SiteConfigInvalid) as refused:  # chosen at run time: refused before any spec exists
        promotion_spec(site, "chat", "improved", plan="gated")
    assert "approval 'auto' is refused" in str(refused.value) and "routes.chat" in str(refused.value)
    document["routes"]["chat"]["plan"] = "gated"  # the route's own default: refused when the site is read
    with pytest.raises(SiteConfigInvalid) as refused:
        load_site(write_site(tmp_path, document))
    assert "route 'chat': approval 'auto' is refused" in str(refused.value)
    with pytest.raises(ValueError, match="approval 'auto' is refused"):  # a spec file written by hand, too
        PromotionSpec.model_validate({**promotion_spec(site, "chat", "improved").model_dump(),
                                      "plan": gated.model_dump()})


def test_a_route_default_that_names_nothing_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(SiteConfigInvalid) as refused:
        load_site(write_site(tmp_path, site_json(plan="missing")))
    assert "names plan 'missing'" in str(refused.value) and "site.json" in str(refused.value)


def test_a_bad_field_and_a_missing_file_are_named(tmp_path: Path) -> None:
    with pytest.raises(SiteConfigInvalid) as bad:
        load_site(write_site(tmp_path, site_json(worker_urls=["http://a"])))
    assert "routes.chat.worker_urls" in str(bad.value)
    with pytest.raises(SiteConfigInvalid) as missing:
        load_site(tmp_path / "absent.json")
    assert "absent.json" in str(missing.value) and "REVGATE_SITE" in str(missing.value)
    with pytest.raises(SiteConfigInvalid):
        load_site(write_site(tmp_path, site_json(candidates={"improved": "latest"})))


def test_the_site_file_comes_from_the_argument_the_environment_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REVGATE_SITE", raising=False)
    assert site_path() == Path("revgate-site.json")
    monkeypatch.setenv("REVGATE_SITE", "/etc/revgate/site.json")
    assert site_path() == Path("/etc/revgate/site.json")
    assert site_path("other.json") == Path("other.json")


def test_the_documented_site_configuration_loads(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text[text.index("### The site configuration"):]
    example = section[section.index("```json") + len("```json"):section.index("```\n", section.index("```json") + 7)]
    path = tmp_path / "site.json"
    path.write_text(example, encoding="utf-8")
    site = load_site(path)
    spec = promotion_spec(site, "chat", "improved")
    assert spec.plan == site.plans["half"] and spec.records_sink == "s3://records/prod/chat"


def test_an_auditor_trusts_the_sites_approver_keys_and_its_own_first(tmp_path: Path) -> None:
    from revgate.cli.evidence import ApproverKeyInvalid, trusted_keys

    (tmp_path / "alice.pub").write_text("-----BEGIN PUBLIC KEY-----\nalice-from-site\n", encoding="utf-8")
    (tmp_path / "mine.pub").write_text("-----BEGIN PUBLIC KEY-----\nalice-mine\n", encoding="utf-8")
    document = site_json()
    signed = RolloutPlan.build(steps=[SetWeight(weight_ppm=50_000), Approve()], approvers=("Alice", "bob"),
                               signed_approval=True, approver_keys={"Alice": str(tmp_path / "alice.pub"),
                                                                    "bob": "-----BEGIN PUBLIC KEY-----\nbob\n"})
    document["plans"]["signed"] = signed.model_dump(mode="json")
    site = str(write_site(tmp_path, document))
    keys = trusted_keys([], site)
    assert keys == {"alice": "-----BEGIN PUBLIC KEY-----\nalice-from-site\n",
                    "bob": "-----BEGIN PUBLIC KEY-----\nbob\n"}
    assert trusted_keys([f"alice={tmp_path / 'mine.pub'}"], site)["alice"].endswith("alice-mine\n")
    with pytest.raises(ApproverKeyInvalid, match="is not NAME=FILE"):
        trusted_keys(["alice"], "")


def test_the_routes_record_signers_reach_the_spec_and_bad_ones_are_refused_at_load(tmp_path: Path) -> None:
    from revgate.registry.record_signing import new_key_pair

    pem = new_key_pair(tmp_path / "router.key").public_pem().decode()
    signers = {"router-a": pem, "router-b": "/etc/revgate/router-b.pub"}
    site = load_site(write_site(tmp_path, site_json(record_signers=signers)))
    assert promotion_spec(site, "chat", "improved").record_signers == signers
    assert promotion_spec(load_site(write_site(tmp_path, site_json())), "chat", "improved").record_signers == {}
    for bad, expected in (({"a/b": pem}, "no router id"), ({"router-a": pem.replace("MC", "xx", 1)}, "PEM"),
                          ({"router-a": pem}, "records_sink")):
        sink = "" if expected == "records_sink" else "s3://records/prod"
        with pytest.raises(SiteConfigInvalid) as refused:
            load_site(write_site(tmp_path, site_json(record_signers=bad, records_sink=sink)))
        assert expected in str(refused.value) and "routes.chat" in str(refused.value)


@pytest.mark.parametrize("field", ["router_records", "paired_records"])
def test_a_routers_local_records_file_is_refused_with_the_sink_named_instead(tmp_path: Path, field: str) -> None:
    # One router's local file holds 1/R of the traffic with R routers, and none where records go to S3:
    # a capacity rule or a rollback window reading it is blind. The one source is the record sink.
    with pytest.raises(SiteConfigInvalid) as refused:
        load_site(write_site(tmp_path, site_json(**{field: "/srv/router/records.jsonl"})))
    assert field in str(refused.value) and "records_sink" in str(refused.value) and "routes.chat" in str(refused.value)
    spec = promotion_spec(load_site(write_site(tmp_path, site_json())), "chat", "improved")
    with pytest.raises(ValueError, match=f"{field}.*give records_sink"):
        PromotionSpec.model_validate_json(json.dumps({**spec.model_dump(mode="json"), field: "records.jsonl"}))
    with pytest.raises(ValueError, match="records_sink"):
        PromotionSpec.model_validate_json(json.dumps({**spec.model_dump(mode="json"), "records_sink": ""}))


def test_an_old_document_naming_the_controllers_engine_environment_is_refused_with_what_to_do(tmp_path: Path) -> None:
    # The engine build is the worker agents' now: a spec or site that still names engine_venv was refused as
    # an unknown field, with no word of why or what to do instead.
    with pytest.raises(SiteConfigInvalid) as refused:
        load_site(write_site(tmp_path, site_json(engine_venv=".venv-engine")))
    assert "engine_venv" in str(refused.value) and "GET /v1/engine" in str(refused.value)
    spec = promotion_spec(load_site(write_site(tmp_path, site_json())), "chat", "improved")
    with pytest.raises(ValueError, match="engine_venv: the controller needs no engine environment"):
        PromotionSpec.model_validate_json(json.dumps({**spec.model_dump(mode="json"), "engine_venv": ".venv-engine"}))
