"""``revgate models make``: train the revisions, write their folders and manifests, cache the zoo.

The zoo lands in ``OUT_DIR`` all at once: it is built in a sibling temporary folder and renamed
into place, so a reader never sees half a zoo. A zoo whose index carries the current cache key
(a digest over the recipe and the code that makes it) and whose files still match their
manifests is reused as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from revgate.evaluation import reference_task
from revgate.manifests.artifact import ArtifactManifest
from revgate.registry.build import build_manifest
from revgate.zoo import derive, files, recipe, tokenizer, train
from revgate.zoo.index import INDEX_FILE, ZooRevision, folder_lock, load_revisions, read_index
from revgate.zoo.recipe import RevisionSpec, ZooConfig

MODELS_DIR = "models"
MANIFESTS_DIR = "manifests"
# The modules whose code decides the zoo's bytes; orchestration and caching here do not.
_SOURCES = (derive, files, recipe, tokenizer, train, reference_task)


def cache_key(config: ZooConfig) -> str:
    """Digest over the recipe, the code that turns it into bytes, and the torch build."""
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
    digest.update(torch.__version__.encode())
    for module in _SOURCES:
        digest.update(Path(str(module.__file__)).read_bytes())
    return "sha256:" + digest.hexdigest()


def make_zoo(out_dir: Path, config: ZooConfig, log: Callable[[str], None] = print) -> dict[str, ZooRevision]:
    """Build the zoo into ``out_dir`` (or reuse it when current); returns the revisions by name."""
    key = cache_key(config)
    with folder_lock(out_dir):
        current = reusable_index(out_dir, key)
        if current is not None:
            log(f"zoo: reusing {out_dir} (cache key {key[7:19]})")
            return current
        staging = out_dir.parent / f".{out_dir.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            revisions = _build(staging, config, key, log)
            _swap_into_place(staging, out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return revisions


def reusable_index(out_dir: Path, key: str) -> dict[str, ZooRevision] | None:
    """The revisions of a zoo built with ``key`` whose files still match their manifests, else None."""
    if not (out_dir / INDEX_FILE).exists() or read_index(out_dir).get("cache_key") != key:
        return None
    revisions = load_revisions(out_dir)
    for revision in revisions.values():
        manifest = ArtifactManifest.from_json((out_dir / MANIFESTS_DIR / f"{revision.name}.json").read_bytes())
        rebuilt = manifest_of(out_dir / revision.path, revision.base_artifact)
        if rebuilt.digest != manifest.digest or manifest.digest != revision.artifact_digest:
            return None
    return revisions


def manifest_of(folder: Path, base_artifact: str | None = None) -> ArtifactManifest:
    """The artifact manifest of a zoo folder (adapter files bind to ``base_artifact``)."""
    return build_manifest(folder, base_artifact=base_artifact, workers=1)


def _build(staging: Path, config: ZooConfig, key: str, log: Callable[[str], None]) -> dict[str, ZooRevision]:
    train.pin_threads(config.torch_threads)
    weights: dict[str, derive.Weights] = {}
    revisions: dict[str, ZooRevision] = {}
    for spec in config.revisions:
        started = time.monotonic()
        revisions[spec.name] = _make_revision(staging, config, spec, weights, revisions)
        log(f"zoo: {spec.name:<17} {spec.kind:<11} {time.monotonic() - started:6.1f} s  {spec.purpose}")
    index = {
        "cache_key": key,
        "recipe": config.to_dict(),
        "revisions": {name: asdict(revision) for name, revision in revisions.items()},
    }
    (staging / INDEX_FILE).write_bytes(files.json_bytes(index))
    return revisions


def _make_revision(
    staging: Path,
    config: ZooConfig,
    spec: RevisionSpec,
    weights: dict[str, derive.Weights],
    built: dict[str, ZooRevision],
) -> ZooRevision:
    folder = staging / MODELS_DIR / spec.name
    derive.write_revision(folder, config, spec, weights)
    base_artifact = built[derive.parent_of(spec)].artifact_digest if spec.kind == "adapter" else None
    manifest = manifest_of(folder, base_artifact)
    (staging / MANIFESTS_DIR).mkdir(exist_ok=True)
    (staging / MANIFESTS_DIR / f"{spec.name}.json").write_bytes(manifest.canonical() + b"\n")
    return ZooRevision(
        name=spec.name,
        kind=spec.kind,
        parent=spec.parent,
        path=f"{MODELS_DIR}/{spec.name}",
        artifact_digest=manifest.digest,
        base_artifact=base_artifact,
        purpose=spec.purpose,
    )


def _swap_into_place(staging: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` with ``staging`` by renames; the old zoo is removed only afterwards."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    retired = out_dir.parent / f".{out_dir.name}.retired-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(retired)
    staging.rename(out_dir)
    shutil.rmtree(retired, ignore_errors=True)
