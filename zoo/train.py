"""Training on the CPU: a tiny Llama on the reference task, deterministic for a seed and thread count."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from revgate.evaluation.reference_task import Example, examples
from revgate.zoo.recipe import Architecture, Schedule
from revgate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, decode, encode

IGNORE = -100
LORA_TARGETS = ("q_proj", "v_proj")


def llama_config(arch: Architecture, num_layers: int | None = None) -> LlamaConfig:
    """The Hugging Face config of the zoo architecture (optionally with another layer count)."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=num_layers or arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_positions,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def new_model(arch: Architecture, seed: int) -> LlamaForCausalLM:
    """A freshly initialised model; the same seed gives the same weights."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(arch))
    return model.float()


def pin_threads(threads: int) -> None:
    """Fix the thread count: a different count sums in another order and gives other weights."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def batch_tensors(batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, labels): BOS + prompt + answer + EOS, loss on answer and EOS only, right-padded."""
    rows, targets = [], []
    for example in batch:
        prompt = [BOS_ID, *encode(example.prompt)]
        answer = [*encode(example.answer), EOS_ID]
        rows.append(prompt + answer)
        targets.append([IGNORE] * len(prompt) + answer)
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows])
    labels = torch.tensor([t + [IGNORE] * (width - len(t)) for t in targets])
    return ids, labels


def batches(schedule: Schedule) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The schedule's batches, drawn from its data seed and slice mix."""
    data = examples(schedule.data_seed, schedule.steps * schedule.batch_size, dict(schedule.mix))
    for start in range(0, len(data), schedule.batch_size):
        yield batch_tensors(data[start : start + schedule.batch_size])


def learning_rate(schedule: Schedule, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < schedule.warmup_steps:
        return schedule.learning_rate * (step + 1) / schedule.warmup_steps
    progress = (step - schedule.warmup_steps) / max(1, schedule.steps - schedule.warmup_steps)
    return schedule.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model: nn.Module, schedule: Schedule, parameters: Iterable[nn.Parameter] | None = None) -> float:
    """Run ``schedule`` on ``model`` (only ``parameters`` if given); returns the last batch's loss."""
    model.train()
    trainable = list(parameters) if parameters is not None else list(model.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=schedule.learning_rate, weight_decay=schedule.weight_decay)
    loss_value = math.nan
    for step, (ids, labels) in enumerate(batches(schedule)):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(schedule, step)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


class LoraLinear(nn.Module):
    """``base(x) + (alpha / r) * B(A(x))`` with the base frozen; B starts at zero (PEFT's default)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: int) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapted projection."""
        adapted: torch.Tensor = self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scaling
        return adapted


def attach_lora(model: LlamaForCausalLM, rank: int, alpha: int) -> dict[str, LoraLinear]:
    """Wrap the attention projections in LoRA; returns them by module path. Base weights are frozen."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    adapters: dict[str, LoraLinear] = {}
    for index, layer in enumerate(model.model.layers):
        for target in LORA_TARGETS:
            wrapped = LoraLinear(getattr(layer.self_attn, target), rank, alpha)
            setattr(layer.self_attn, target, wrapped)
            adapters[f"model.layers.{index}.self_attn.{target}"] = wrapped
    return adapters


@torch.no_grad()
def greedy_answers(model: LlamaForCausalLM, prompts: list[str], max_new_tokens: int = 9) -> list[str]:
    """Greedy completions (up to EOS) computed in-process, prompts of equal length batched together."""
    model.eval()
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(encode(prompt)), []).append(index)
    answers = [""] * len(prompts)
    for indices in by_length.values():
        ids = torch.tensor([[BOS_ID, *encode(prompts[i])] for i in indices])
        generated = torch.empty((len(indices), 0), dtype=torch.long)
        for _ in range(max_new_tokens):
            step = model(input_ids=torch.cat([ids, generated], dim=1)).logits[:, -1].argmax(dim=-1, keepdim=True)
            generated = torch.cat([generated, step], dim=1)
        for row, index in enumerate(indices):
            tokens = generated[row].tolist()
            answers[index] = decode(tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens)
    return answers
