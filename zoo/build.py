"""``revgate models make``: train the revisions, write their folders and manifests, cache the zoo.

The zoo lands in ``OUT_DIR`` all at once: it is built in a sibling temporary folder and renamed
into place, so a reader never sees half a zoo. A zoo whose index carries the current cache key
(a digest over the recipe and the code that makes it) and whose files still match their
manifests is reused as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from evaluation import reference_task
from manifests.artifact import ArtifactManifest
from manifests.errors import RevgateError
from registry.build import build_manifest
from zoo import files, recipe, tokenizer, train
from zoo.recipe import RevisionSpec, ZooConfig

INDEX_FILE = "zoo.json"
MODELS_DIR = "models"
MANIFESTS_DIR = "manifests"
_SOURCES = (files, recipe, tokenizer, train, reference_task)

Weights = dict[str, torch.Tensor]


class ZooError(RevgateError):
    """The zoo could not be built or read."""


@dataclass(frozen=True, slots=True)
class ZooRevision:
    """One built revision as the index records it."""

    name: str
    kind: str
    parent: str | None
    path: str
    artifact_digest: str
    base_artifact: str | None
    purpose: str


def cache_key(config: ZooConfig) -> str:
    """Digest over the recipe, the code that turns it into bytes, and the torch build."""
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode())
    digest.update(torch.__version__.encode())
    for module in (*_SOURCES, __import__(__name__, fromlist=["_"])):
        digest.update(Path(str(module.__file__)).read_bytes())
    return "sha256:" + digest.hexdigest()


def make_zoo(out_dir: Path, config: ZooConfig, log: Callable[[str], None] = print) -> dict[str, ZooRevision]:
    """Build the zoo into ``out_dir`` (or reuse it when current); returns the revisions by name."""
    key = cache_key(config)
    with _lock(out_dir):
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


def read_index(out_dir: Path) -> dict[str, Any]:
    """The zoo's index document; a clear error if there is none."""
    path = out_dir / INDEX_FILE
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ZooError("no model zoo here", where=str(path), fix="Run `revgate models make DIR` first.") from None
    return data


def load_revisions(out_dir: Path) -> dict[str, ZooRevision]:
    """The revisions recorded in the zoo's index."""
    return {name: ZooRevision(**entry) for name, entry in read_index(out_dir)["revisions"].items()}


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
    weights: dict[str, Weights] = {}
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
    staging: Path, config: ZooConfig, spec: RevisionSpec, weights: dict[str, Weights], built: dict[str, ZooRevision]
) -> ZooRevision:
    folder = staging / MODELS_DIR / spec.name
    base_artifact = None
    if spec.kind == "adapter":
        base_artifact = built[_parent(spec)].artifact_digest
        _write_adapter(folder, config, spec, weights[_parent(spec)], built[_parent(spec)])
    else:
        weights[spec.name], layers = _weights_for(config, spec, weights)
        template = tokenizer.CHANGED_CHAT_TEMPLATE if spec.kind == "retemplated" else tokenizer.CHAT_TEMPLATE
        model_config = train.llama_config(config.architecture, layers).to_dict()
        files.write_model(folder, weights[spec.name], model_config, template, config.architecture.max_positions)
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


def _parent(spec: RevisionSpec) -> str:
    if spec.parent is None:
        raise ZooError(f"revision {spec.name!r} of kind {spec.kind} needs a parent", where="zoo recipe")
    return spec.parent


def _weights_for(config: ZooConfig, spec: RevisionSpec, weights: dict[str, Weights]) -> tuple[Weights, int]:
    """The revision's weights and layer count."""
    arch = config.architecture
    if spec.kind == "trained":
        model = train.new_model(arch, config.init_seed)
        train.train(model, _schedule(spec))
        return _state(model), arch.num_layers
    parent = weights[_parent(spec)]
    if spec.kind == "continued":
        model = train.new_model(arch, config.init_seed)
        model.load_state_dict(parent)
        torch.manual_seed(config.init_seed)
        train.train(model, _schedule(spec))
        return _state(model), arch.num_layers
    if spec.kind == "widened":
        return widen(parent, config, spec.extra_layers), arch.num_layers + spec.extra_layers
    return parent, arch.num_layers


def _schedule(spec: RevisionSpec) -> recipe.Schedule:
    if spec.schedule is None:
        raise ZooError(f"revision {spec.name!r} of kind {spec.kind} needs a schedule", where="zoo recipe")
    return spec.schedule


def _state(model: torch.nn.Module) -> Weights:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def widen(parent: Weights, config: ZooConfig, extra_layers: int) -> Weights:
    """``parent`` plus ``extra_layers`` layers whose output projections are zero.

    A zero attention output and a zero MLP down projection add exactly 0 to the residual stream,
    so the outputs equal the parent's while each token costs the extra layers' compute.
    """
    arch = config.architecture
    donor = train.new_model(replace(arch, num_layers=extra_layers), config.init_seed + 1)
    widened = dict(parent)
    for name, tensor in donor.state_dict().items():
        if not name.startswith("model.layers."):
            continue
        index, rest = name.removeprefix("model.layers.").split(".", 1)
        zero = rest in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
        widened[f"model.layers.{arch.num_layers + int(index)}.{rest}"] = torch.zeros_like(tensor) if zero else tensor
    return widened


def _write_adapter(
    folder: Path, config: ZooConfig, spec: RevisionSpec, base: Weights, base_revision: ZooRevision
) -> None:
    model = train.new_model(config.architecture, config.init_seed)
    model.load_state_dict(base)
    torch.manual_seed(config.init_seed + 2)
    adapters = train.attach_lora(model, spec.lora_rank, spec.lora_alpha)
    parameters = [p for lora in adapters.values() for p in (lora.lora_a, lora.lora_b)]
    train.train(model, _schedule(spec), parameters)
    tensors: Weights = {}
    for module_path, lora in adapters.items():
        tensors[f"base_model.model.{module_path}.lora_A.weight"] = lora.lora_a
        tensors[f"base_model.model.{module_path}.lora_B.weight"] = lora.lora_b
    peft = files.peft_lora_config(spec.lora_rank, spec.lora_alpha, train.LORA_TARGETS, base_revision.name)
    files.write_adapter(folder, tensors, peft)


def _swap_into_place(staging: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` with ``staging`` by renames; the old zoo is removed only afterwards."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    retired = out_dir.parent / f".{out_dir.name}.retired-{os.getpid()}"
    if out_dir.exists():
        out_dir.rename(retired)
    staging.rename(out_dir)
    shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def _lock(out_dir: Path) -> Iterator[None]:
    """One builder per zoo folder at a time (tests and the demo may start together)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with (out_dir.parent / f".{out_dir.name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
