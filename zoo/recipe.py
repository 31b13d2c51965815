"""The zoo's recipe: architecture, training schedule and the revisions, as frozen data.

Everything that decides the zoo's bytes is here or in the code that reads it; the cache key is a
digest over both, so changing either rebuilds the zoo.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RevisionKind = Literal["trained", "continued", "widened", "retemplated", "adapter"]


@dataclass(frozen=True, slots=True)
class Architecture:
    """A tiny Llama that vLLM's CPU kernels accept (head dim 32)."""

    hidden_size: int = 128
    intermediate_size: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 64

    @property
    def head_dim(self) -> int:
        """Attention head size; vLLM on the CPU needs 32, 64, 80 or more."""
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, slots=True)
class Schedule:
    """One training run: AdamW with warm-up and cosine decay, loss on answer tokens only."""

    steps: int
    learning_rate: float
    data_seed: int
    mix: tuple[tuple[str, float], ...] = ()
    batch_size: int = 64
    warmup_steps: int = 50
    weight_decay: float = 0.01


@dataclass(frozen=True, slots=True)
class RevisionSpec:
    """How one revision is made from its parent (or from scratch)."""

    name: str
    kind: RevisionKind
    parent: str | None = None
    schedule: Schedule | None = None
    extra_layers: int = 0
    lora_rank: int = 0
    lora_alpha: int = 0
    purpose: str = ""


@dataclass(frozen=True, slots=True)
class ZooConfig:
    """The whole zoo: architecture, seed, threads and the revisions in build order."""

    architecture: Architecture = field(default_factory=Architecture)
    init_seed: int = 20261129
    # One thread: deterministic, and on shared cores two threads spin at every OpenMP barrier and ran
    # up to 40 times slower; a thread count is part of the recipe because it changes the weights.
    torch_threads: int = 1
    revisions: tuple[RevisionSpec, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the cache key and the zoo index."""
        return asdict(self)

    def revision(self, name: str) -> RevisionSpec:
        """The spec named ``name``."""
        for spec in self.revisions:
            if spec.name == name:
                return spec
        raise KeyError(name)


REGRESSED_SLICE = "sort/long"
ADAPTER_NAME = "adapter"


def default_zoo(scale: float = 1.0) -> ZooConfig:
    """The reference zoo; ``scale`` shortens every schedule (for quick experiments, not the gates)."""

    def steps(count: int) -> int:
        return max(20, int(count * scale))

    base_lr = 3e-3
    return ZooConfig(
        revisions=(
            RevisionSpec("stable", "trained", schedule=Schedule(steps(1200), base_lr, 1), purpose="the baseline"),
            RevisionSpec(
                "improved",
                "continued",
                parent="stable",
                schedule=Schedule(steps(600), base_lr / 2, 2),
                purpose="more training: better on average, no slice worse",
            ),
            RevisionSpec(
                "slice-regressed",
                "continued",
                parent="stable",
                schedule=Schedule(steps(600), base_lr / 2, 2, mix=((REGRESSED_SLICE, 0.1),)),
                purpose=f"more training with {REGRESSED_SLICE} down-weighted: better on average, worse there",
            ),
            RevisionSpec(
                "slow",
                "widened",
                parent="stable",
                extra_layers=8,
                purpose="stable plus zero-initialised layers: same outputs, slower per token",
            ),
            RevisionSpec(
                "template-changed",
                "retemplated",
                parent="stable",
                purpose="stable's weights with a different chat template",
            ),
            RevisionSpec(
                ADAPTER_NAME,
                "adapter",
                parent="stable",
                schedule=Schedule(
                    steps(300),
                    2e-3,
                    3,
                    mix=(("rev/short", 0.0), ("rev/long", 0.0), ("sort/short", 0.0), ("sort/long", 0.0)),
                ),
                lora_rank=8,
                lora_alpha=16,
                purpose="a LoRA adapter on stable, fine-tuned on the add family",
            ),
        )
    )
