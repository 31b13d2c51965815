"""Writing Hugging Face-format model and PEFT adapter folders, byte for byte reproducibly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from revgate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, special_tokens_map, tokenizer_config, tokenizer_json

WEIGHTS_FILE = "model.safetensors"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"


def json_bytes(data: Any) -> bytes:
    """Stable JSON file bytes: sorted keys, indented, trailing newline."""
    return (json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_model(
    folder: Path, weights: dict[str, torch.Tensor], config: dict[str, Any], chat_template: str, max_length: int
) -> None:
    """A complete model folder: weights, config, tokenizer, chat template, generation config."""
    folder.mkdir(parents=True, exist_ok=False)
    save_weights(folder / WEIGHTS_FILE, weights)
    (folder / "config.json").write_bytes(json_bytes(config))
    (folder / "generation_config.json").write_bytes(json_bytes(generation_config()))
    (folder / "tokenizer.json").write_bytes(tokenizer_json())
    (folder / "tokenizer_config.json").write_bytes(json_bytes(tokenizer_config(chat_template, max_length)))
    (folder / "special_tokens_map.json").write_bytes(json_bytes(special_tokens_map()))


def write_adapter(folder: Path, weights: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    """A PEFT LoRA adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors``."""
    folder.mkdir(parents=True, exist_ok=False)
    save_weights(folder / ADAPTER_WEIGHTS_FILE, weights)
    (folder / ADAPTER_CONFIG_FILE).write_bytes(json_bytes(config))


def save_weights(path: Path, weights: dict[str, torch.Tensor]) -> None:
    """Safetensors with fixed metadata, so equal tensors give equal bytes."""
    tensors = {name: tensor.detach().to(torch.float32).contiguous().clone() for name, tensor in weights.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def generation_config() -> dict[str, Any]:
    """Greedy by default; stops at EOS."""
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False}


def peft_lora_config(rank: int, alpha: int, targets: tuple[str, ...], base_model: str) -> dict[str, Any]:
    """The ``adapter_config.json`` PEFT writes for a plain LoRA on a causal LM."""
    return {
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "target_modules": sorted(targets),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
