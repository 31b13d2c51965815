"""Artifact manifests of zoo folders: every file, its size, sha256 and role."""

from __future__ import annotations

import hashlib
from pathlib import Path

from manifests.artifact import ArtifactManifest, ManifestEntry, Role
from zoo.files import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, CHAT_TEMPLATE_FILE

_ROLES = {
    "config.json": Role.CONFIG,
    "generation_config.json": Role.GENERATION_CONFIG,
    "tokenizer.json": Role.TOKENIZER,
    "tokenizer_config.json": Role.TOKENIZER,
    "special_tokens_map.json": Role.TOKENIZER,
    CHAT_TEMPLATE_FILE: Role.CHAT_TEMPLATE,
    ADAPTER_CONFIG_FILE: Role.ADAPTER,
    ADAPTER_WEIGHTS_FILE: Role.ADAPTER,
}


def role_of(name: str) -> Role:
    """The role a zoo file plays, from its name."""
    if name in _ROLES:
        return _ROLES[name]
    return Role.WEIGHTS if name.endswith(".safetensors") else Role.OTHER


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_of(folder: Path, base_artifact: str | None = None) -> ArtifactManifest:
    """The manifest of every file under ``folder``; adapter files bind to ``base_artifact``."""
    entries = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        role = role_of(path.name)
        entries.append(
            ManifestEntry(
                path=path.relative_to(folder).as_posix(),
                size=path.stat().st_size,
                sha256=file_sha256(path),
                role=role,
                base_artifact=base_artifact if role is Role.ADAPTER else None,
            )
        )
    return ArtifactManifest(entries=tuple(entries))
