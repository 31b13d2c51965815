"""Roles, tree listing and parallel hashing of artifact folders."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from revgate.manifests.artifact import Role
from revgate.manifests.errors import ManifestInvalid
from revgate.registry.build import build_manifest, entries_for, role_for
from revgate.registry.errors import UnsafePath
from revgate.registry.hashing import FileDigest, hash_file, hash_tree
from revgate.registry.tree import list_files, served_path

BASE = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("path", "role"),
    [
        ("model.safetensors", Role.WEIGHTS),
        ("model-00001-of-00002.safetensors", Role.WEIGHTS),
        ("model.safetensors.index.json", Role.WEIGHTS),
        ("pytorch_model.bin", Role.WEIGHTS),
        ("config.json", Role.CONFIG),
        ("generation_config.json", Role.GENERATION_CONFIG),
        ("tokenizer.json", Role.TOKENIZER),
        ("special_tokens_map.json", Role.TOKENIZER),
        ("tokenizer_config.json", Role.TOKENIZER),
        ("chat_template.jinja", Role.CHAT_TEMPLATE),
        ("quantize_config.json", Role.QUANTIZATION),
        ("adapter_config.json", Role.ADAPTER),
        ("adapter_model.safetensors", Role.ADAPTER),
        ("README.md", Role.OTHER),
        ("sub/config.json", Role.CONFIG),
    ],
)
def test_roles_from_file_names(path: str, role: Role) -> None:
    assert role_for(path) is role


def test_tokenizer_config_with_template_is_the_chat_template() -> None:
    assert role_for("tokenizer_config.json", tokenizer_has_chat_template=True) is Role.CHAT_TEMPLATE


def test_adapter_files_need_a_base_digest() -> None:
    digests = {"adapter_config.json": FileDigest(2, "00" * 32)}
    with pytest.raises(ManifestInvalid, match="base artifact"):
        entries_for(digests, chat_template=False, base_artifact=None)
    (entry,) = entries_for(digests, chat_template=False, base_artifact=BASE)
    assert entry.base_artifact == BASE and entry.role is Role.ADAPTER


def _folder(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"hidden_size": 128}')
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (model / "model.safetensors").write_bytes(os.urandom(300_000))
    (model / "sub" / "extra.bin").write_bytes(b"")
    return model


def test_build_manifest_pins_every_file_with_sha256(tmp_path: Path) -> None:
    model = _folder(tmp_path)
    manifest = build_manifest(model, workers=2)
    by_path = manifest.by_path()
    assert sorted(by_path) == ["config.json", "model.safetensors", "sub/extra.bin", "tokenizer_config.json"]
    data = (model / "model.safetensors").read_bytes()
    assert by_path["model.safetensors"].sha256 == hashlib.sha256(data).hexdigest()
    assert by_path["model.safetensors"].size == len(data)
    assert by_path["tokenizer_config.json"].role is Role.CHAT_TEMPLATE
    assert by_path["sub/extra.bin"].sha256 == hashlib.sha256(b"").hexdigest()


def test_parallel_and_serial_hashing_agree_and_report_progress(tmp_path: Path) -> None:
    model = _folder(tmp_path)
    files = list_files(model)
    seen: list[int] = []
    parallel = hash_tree(model, files, workers=4, progress=seen.append)
    assert parallel == hash_tree(model, files, workers=1)
    assert sum(seen) == sum(digest.size for digest in parallel.values())


def test_symlinks_are_refused_when_listing_and_when_hashing(tmp_path: Path) -> None:
    model = _folder(tmp_path)
    (tmp_path / "outside").write_text("secret")
    (model / "link.json").symlink_to(tmp_path / "outside")
    with pytest.raises(UnsafePath, match="symlink") as caught:
        list_files(model)
    assert caught.value.where == "link.json"
    with pytest.raises(UnsafePath):
        hash_file(model / "link.json")


def test_symlinked_directories_and_fifos_are_refused(tmp_path: Path) -> None:
    model = _folder(tmp_path)
    (model / "dir-link").symlink_to(model / "sub")
    with pytest.raises(UnsafePath, match="symlink"):
        list_files(model)
    (model / "dir-link").unlink()
    os.mkfifo(model / "pipe")
    with pytest.raises(UnsafePath, match="special file"):
        list_files(model)
    with pytest.raises(UnsafePath, match="not a regular file"):
        hash_file(model / "pipe")  # refused at once, not blocked waiting for a writer


@pytest.mark.parametrize(
    ("names", "problem"),
    [
        (["caf\u00e9.json", "cafe\u0301.json"], "normalising"),  # two files on Linux, one on macOS
        (["weights\n.bin"], "control character"),
        (["Model.bin", "model.bin"], "case-insensitive"),
    ],
)
def test_folders_with_ambiguous_names_are_refused(tmp_path: Path, names: list[str], problem: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in names:
        (model / name).write_text("x")
    with pytest.raises(UnsafePath, match=problem):
        build_manifest(model)


def test_a_single_file_is_an_artifact_of_one_entry(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"GGUF" + bytes(100))
    (tmp_path / "unrelated.txt").write_text("beside it, not part of it")
    manifest = build_manifest(tmp_path / "model.gguf")
    assert [(entry.path, entry.size, entry.role) for entry in manifest.entries] == [("model.gguf", 104, Role.WEIGHTS)]
    assert list_files(tmp_path / "model.gguf") == ("model.gguf",)


def test_the_engine_loads_a_single_file_artifact_by_its_file(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    single = build_manifest(tmp_path / "model.gguf")
    assert served_path(tmp_path, single) == tmp_path / "model.gguf"
    folder = _folder(tmp_path / "hf")
    assert served_path(folder, build_manifest(folder)) == folder
