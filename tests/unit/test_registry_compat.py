"""Compatibility of artifact and execution config: each problem names its field."""

from __future__ import annotations

from typing import Any

import pytest

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.revision import ExecutionConfig, InterfacePolicy
from revgate.registry.compat import compatibility_problems

CONFIG: dict[str, Any] = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "max_position_embeddings": 512}
HEX = "00" * 32


def _manifest(*, chat: bool = True) -> ArtifactManifest:
    entries: list[dict[str, Any]] = [
        {"path": "config.json", "size": 1, "sha256": HEX, "role": "config"},
        {"path": "model.safetensors", "size": 1, "sha256": HEX, "role": "weights"},
    ]
    if chat:
        entries.append({"path": "tokenizer_config.json", "size": 1, "sha256": HEX, "role": "chat_template"})
    return ArtifactManifest.build(entries=entries)


def _fields(config: dict[str, Any], manifest: ArtifactManifest | None = None, adapter: ArtifactManifest | None = None,
            interface: InterfacePolicy | None = None, **execution: Any) -> list[str]:
    problems = compatibility_problems(config, manifest or _manifest(), ExecutionConfig.build(**execution),
                                      interface or InterfacePolicy(), adapter)
    return [problem.field for problem in problems]


def test_the_tiny_reference_model_is_compatible() -> None:
    assert _fields(CONFIG, max_model_len=256) == []


def test_heads_must_split_over_tensor_parallel_ranks() -> None:
    assert _fields(CONFIG, max_model_len=256, tensor_parallel_size=3) == ["execution.tensor_parallel_size"] * 2
    assert _fields(CONFIG, max_model_len=256, tensor_parallel_size=2) == []
    # 2 KV heads over 4 ranks: vLLM replicates each KV head on two ranks.
    assert _fields(CONFIG, max_model_len=256, tensor_parallel_size=4) == []
    assert _fields({**CONFIG, "num_key_value_heads": 3, "num_attention_heads": 6, "hidden_size": 192},
                   max_model_len=256, tensor_parallel_size=2) == ["execution.tensor_parallel_size"]


@pytest.mark.parametrize(("hidden", "heads", "ok"), [(128, 4, True), (64, 4, False), (320, 4, True), (96, 2, False)])
def test_head_size_must_be_one_the_engine_supports(hidden: int, heads: int, ok: bool) -> None:
    config = {**CONFIG, "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": heads}
    assert (_fields(config, max_model_len=256) == []) is ok


def test_max_model_len_within_position_limit() -> None:
    assert _fields(CONFIG, max_model_len=1024) == ["execution.max_model_len"]


def test_quantization_must_be_supported_and_match_the_weights() -> None:
    assert _fields(CONFIG, max_model_len=256, quantization="bitsandbytes-magic") == ["execution.quantization"]
    quantized = {**CONFIG, "quantization_config": {"quant_method": "awq"}}
    assert _fields(quantized, max_model_len=256) == []
    assert _fields(quantized, max_model_len=256, quantization="gptq") == ["execution.quantization"]


def test_adapter_must_bind_to_this_artifact() -> None:
    base = _manifest()
    def adapter(digest: str) -> ArtifactManifest:
        return ArtifactManifest.build(entries=[{"path": "adapter_config.json", "size": 1, "sha256": HEX,
                                                "role": "adapter", "base_artifact": digest}])
    assert _fields(CONFIG, base, adapter(base.digest), max_model_len=256, enable_lora=True) == []
    wrong = "sha256:" + "11" * 32
    assert _fields(CONFIG, base, adapter(wrong), max_model_len=256, enable_lora=True) == ["adapter.base_artifact"]
    assert _fields(CONFIG, base, adapter(base.digest), max_model_len=256) == ["execution.enable_lora"]


def test_chat_needs_a_chat_template() -> None:
    no_template = _manifest(chat=False)
    assert _fields(CONFIG, no_template, max_model_len=256) == ["interface.serves_chat"]
    assert _fields(CONFIG, no_template, interface=InterfacePolicy(serves_chat=False), max_model_len=256) == []
