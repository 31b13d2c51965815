"""The artifact commands end to end, and interoperability with model_signing's own command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest

from revgate.cli.main import main
from tests.integration.signing_material import write_chain, write_key

KEYLESS = Path(__file__).resolve().parents[1] / "data" / "keyless-model"


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 128}')
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (folder / "model.safetensors").write_bytes(os.urandom(50_000))
    return folder


def _digest_printed(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_build_sign_verify_with_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path / "model")
    keys, _ = write_key(tmp_path / "keys", "release")
    manifest, signature = tmp_path / "manifest.json", tmp_path / "model.sig"
    assert main(["manifest", "build", str(model), "-o", str(manifest)]) == 0
    digest = _digest_printed(capsys)
    assert json.loads(manifest.read_text())["entries"][2]["role"] == "chat_template"
    assert main(["sign", str(model), "--key", str(keys.private), "--manifest", str(manifest),
                 "-o", str(signature)]) == 0
    assert _digest_printed(capsys) == digest
    assert main(["verify", str(model), "--signature", str(signature), "--key", str(keys.public),
                 "--manifest", str(manifest)]) == 0
    assert digest in capsys.readouterr().out
    (model / "model.safetensors").write_bytes(b"tampered")
    assert main(["verify", str(model), "--signature", str(signature), "--key", str(keys.public)]) == 2
    error = capsys.readouterr().err
    assert "DigestMismatch" in error and "model.safetensors" in error


def test_sign_with_certificate_and_verify_with_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path / "model")
    chain = write_chain(tmp_path / "pki", "release")
    signature = tmp_path / "model.sig"
    assert main(["sign", str(model), "--key", str(chain.leaf_key), "--cert", str(chain.leaf),
                 "--chain", str(chain.intermediate), "-o", str(signature)]) == 0
    assert main(["verify", str(model), "--signature", str(signature), "--chain", str(chain.root)]) == 0
    other = write_chain(tmp_path / "other", "other")
    assert main(["verify", str(model), "--signature", str(signature), "--chain", str(other.root)]) == 2
    assert "UntrustedSigner" in capsys.readouterr().err


def test_verify_keyless_identity(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["verify", str(KEYLESS / "model"), "--signature", str(KEYLESS / "model.sig"),
            "--issuer", "https://sigstore.verify.ibm.com/oauth2"]
    assert main([*args, "--identity", "stefanb@us.ibm.com"]) == 0
    assert main([*args, "--identity", "mallory@example.com"]) == 2
    assert "UntrustedSigner" in capsys.readouterr().err


def test_policy_must_be_exactly_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys, _ = write_key(tmp_path / "keys", "k")
    assert main(["verify", str(tmp_path), "--signature", "x.sig", "--key", str(keys.public),
                 "--identity", "a@b.c", "--issuer", "https://x"]) == 2
    assert "exactly one trust policy" in capsys.readouterr().err


def test_signature_inside_the_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path / "model")
    keys, _ = write_key(tmp_path / "keys", "k")
    assert main(["sign", str(model), "--key", str(keys.private), "-o", str(model / "model.sig")]) == 2
    assert not (model / "model.sig").exists()
    assert "inside the artifact folder" in capsys.readouterr().err


def _model_signing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "model_signing", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_model_signing_cli_and_revgate_verify_each_other(tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    keys, _ = write_key(tmp_path / "keys", "release")
    theirs, ours = tmp_path / "theirs.sig", tmp_path / "ours.sig"
    made = _model_signing("sign", "key", "--private_key", str(keys.private), "--signature", str(theirs), str(model))
    assert made.returncode == 0, made.stderr
    assert main(["verify", str(model), "--signature", str(theirs), "--key", str(keys.public)]) == 0
    assert main(["sign", str(model), "--key", str(keys.private), "-o", str(ours)]) == 0
    checked = _model_signing("verify", "key", "--public_key", str(keys.public), "--signature", str(ours), str(model))
    assert checked.returncode == 0, checked.stderr


@pytest.mark.servers
def test_push_and_pull_through_s3(tmp_path: Path, s3_endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path / "model")
    keys, _ = write_key(tmp_path / "keys", "release")
    signature = tmp_path / "model.sig"
    assert main(["sign", str(model), "--key", str(keys.private), "-o", str(signature)]) == 0
    bucket = f"cli-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/models"
    assert main(["push", str(model), url, "--signature", str(signature), "--endpoint-url", s3_endpoint]) == 0
    digest = _digest_printed(capsys)
    dest, pulled_signature = tmp_path / "cache" / "m", tmp_path / "cache" / "m.sig"
    assert main(["pull", digest, url, str(dest), "--signature-out", str(pulled_signature),
                 "--endpoint-url", s3_endpoint]) == 0
    assert main(["verify", str(dest), "--signature", str(pulled_signature), "--key", str(keys.public)]) == 0
    assert main(["pull", "sha256:" + "00" * 32, url, str(tmp_path / "none"), "--endpoint-url", s3_endpoint]) == 2
    assert "ObjectMissing" in capsys.readouterr().err


def test_push_and_pull_local_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path / "model")
    store = tmp_path / "store"
    assert main(["push", str(model), f"file://{store}"]) == 0
    digest = _digest_printed(capsys)
    assert main(["pull", digest, str(store), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()


def _gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(40_000))
    return path


def test_a_single_file_signed_by_model_signing_verifies_and_travels(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    model = _gguf(tmp_path / "models" / "tiny.gguf")
    keys, _ = write_key(tmp_path / "keys", "release")
    signature, manifest = tmp_path / "tiny.sig", tmp_path / "tiny.manifest.json"
    made = _model_signing("sign", "key", "--private_key", str(keys.private), "--signature", str(signature), str(model))
    assert made.returncode == 0, made.stderr
    assert main(["verify", str(model), "--signature", str(signature), "--key", str(keys.public)]) == 0
    assert main(["manifest", "build", str(model), "-o", str(manifest)]) == 0
    digest = _digest_printed(capsys)
    assert [entry["path"] for entry in json.loads(manifest.read_text())["entries"]] == ["tiny.gguf"]
    assert main(["verify", str(model), "--signature", str(signature), "--key", str(keys.public),
                 "--manifest", str(manifest)]) == 0
    assert digest in capsys.readouterr().out

    store = tmp_path / "store"
    assert main(["push", str(model), str(store), "--signature", str(signature), "--manifest", str(manifest)]) == 0
    assert _digest_printed(capsys) == digest
    dest, pulled_signature = tmp_path / "cache" / "tiny", tmp_path / "cache" / "tiny.sig"
    assert main(["pull", digest, str(store), str(dest), "--signature-out", str(pulled_signature)]) == 0
    assert (dest / "tiny.gguf").read_bytes() == model.read_bytes()
    for pulled in (dest / "tiny.gguf", dest):  # the file itself, or the folder it was pulled into
        assert main(["verify", str(pulled), "--signature", str(pulled_signature), "--key", str(keys.public),
                     "--manifest", str(manifest)]) == 0

    model.write_bytes(model.read_bytes()[:-1] + b"\x00")
    assert main(["verify", str(model), "--signature", str(signature), "--key", str(keys.public)]) == 2
    assert "DigestMismatch" in capsys.readouterr().err


def test_revgate_signs_a_single_file_the_way_model_signing_verifies_it(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    model = _gguf(tmp_path / "tiny.gguf")
    keys, _ = write_key(tmp_path / "keys", "release")
    ours = tmp_path / "ours.sig"
    assert main(["sign", str(model), "--key", str(keys.private), "-o", str(ours)]) == 0
    checked = _model_signing("verify", "key", "--public_key", str(keys.public), "--signature", str(ours), str(model))
    assert checked.returncode == 0, checked.stderr
    folder = _model(tmp_path / "folder")
    assert main(["verify", str(folder), "--signature", str(ours), "--key", str(keys.public)]) == 2
    assert "covers a single file, the artifact has 3 files" in capsys.readouterr().err
