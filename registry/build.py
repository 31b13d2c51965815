"""Build an artifact manifest from a Hugging Face model folder (or a PEFT adapter folder)."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from pathlib import Path

from revgate.manifests.artifact import ArtifactManifest, ManifestEntry, Role
from revgate.manifests.errors import ManifestInvalid
from revgate.registry.hashing import FileDigest, Progress, hash_tree
from revgate.registry.tree import artifact_root, list_files

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".msgpack", ".h5")
_WEIGHT_INDEXES = (".safetensors.index.json", ".bin.index.json")
_TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "special_tokens_map.json",
        "added_tokens.json",
        "spiece.model",
        "sentencepiece.bpe.model",
    }
)
_CHAT_TEMPLATE_FILES = frozenset({"chat_template.jinja", "chat_template.json"})
_QUANTIZATION_FILES = frozenset({"quantize_config.json", "quant_config.json", "quantization_config.json"})
_ADAPTER_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"})


_ROLE_BY_NAME: dict[str, Role] = {
    **{name: Role.ADAPTER for name in _ADAPTER_FILES},
    **{name: Role.CHAT_TEMPLATE for name in _CHAT_TEMPLATE_FILES},
    **{name: Role.TOKENIZER for name in _TOKENIZER_FILES},
    **{name: Role.QUANTIZATION for name in _QUANTIZATION_FILES},
    "config.json": Role.CONFIG,
    "generation_config.json": Role.GENERATION_CONFIG,
}


def role_for(path: str, *, tokenizer_has_chat_template: bool = False) -> Role:
    """The role of a file, from its name; a tokenizer_config with a chat template defines the template."""
    name = posixpath.basename(path)
    if name == "tokenizer_config.json" and tokenizer_has_chat_template:
        return Role.CHAT_TEMPLATE
    if name in _ROLE_BY_NAME:
        return _ROLE_BY_NAME[name]
    if name.endswith(_WEIGHT_INDEXES) or name.endswith(_WEIGHT_SUFFIXES):
        return Role.WEIGHTS
    return Role.OTHER


def has_chat_template(tokenizer_config: Mapping[str, object]) -> bool:
    """Whether a parsed tokenizer_config.json carries a non-empty chat template."""
    return bool(tokenizer_config.get("chat_template"))


def _read_tokenizer_config(model_dir: Path, files: tuple[str, ...]) -> Mapping[str, object]:
    if "tokenizer_config.json" not in files:
        return {}
    try:
        data = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ManifestInvalid(
            f"tokenizer_config.json is not readable JSON ({error})",
            where=str(model_dir / "tokenizer_config.json"),
            fix="Repair or replace the tokenizer config.",
        ) from None
    return data if isinstance(data, dict) else {}


def entries_for(
    digests: Mapping[str, FileDigest], *, chat_template: bool, base_artifact: str | None
) -> list[ManifestEntry]:
    """Manifest entries from file digests; adapter files bind to ``base_artifact``."""
    entries = []
    for path, digest in digests.items():
        role = role_for(path, tokenizer_has_chat_template=chat_template)
        if role is Role.ADAPTER and base_artifact is None:
            raise ManifestInvalid(
                "adapter files need the digest of the base artifact they apply to",
                where=path,
                fix="Pass the base artifact's manifest digest (--base sha256:...).",
            )
        base = base_artifact if role is Role.ADAPTER else None
        entries.append(ManifestEntry.build(path=path, size=digest.size, sha256=digest.sha256, role=role,
                                           base_artifact=base))
    return entries


def build_manifest(
    model_dir: Path,
    *,
    base_artifact: str | None = None,
    workers: int | None = None,
    progress: Progress | None = None,
) -> ArtifactManifest:
    """Hash every file of ``model_dir`` (a folder, or one file) in parallel and pin it in an artifact manifest.

    Refuses symlinks and non-regular files. Adapter files (adapter_config.json,
    adapter_model.safetensors) bind to ``base_artifact``, the base model's manifest digest.
    """
    files = list_files(model_dir)
    root = artifact_root(model_dir)
    chat_template = has_chat_template(_read_tokenizer_config(root, files))
    digests = hash_tree(root, files, workers=workers, progress=progress)
    entries = entries_for(digests, chat_template=chat_template, base_artifact=base_artifact)
    return ArtifactManifest.build(entries=entries)


def total_bytes(model_dir: Path) -> int:
    """Bytes in the regular files of ``model_dir`` (for progress bars)."""
    root = artifact_root(model_dir)
    return sum((root / path).stat().st_size for path in list_files(model_dir))
