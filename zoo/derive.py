"""How each kind of revision is derived from the recipe and its parent: the code behind the bytes.

Everything here is part of the zoo's cache key; the builder around it (staging, caching, index)
is not, so it can change without retraining the zoo.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from revgate.zoo import files, recipe, tokenizer, train
from revgate.zoo.index import ZooError
from revgate.zoo.recipe import RevisionSpec, ZooConfig

Weights = dict[str, torch.Tensor]


def write_revision(folder: Path, config: ZooConfig, spec: RevisionSpec, weights: dict[str, Weights]) -> None:
    """Derive ``spec`` and write its folder; full models add their weights to ``weights`` by name."""
    if spec.kind == "adapter":
        write_adapter(folder, config, spec, weights[parent_of(spec)])
        return
    weights[spec.name], layers = weights_for(config, spec, weights)
    template = tokenizer.CHANGED_CHAT_TEMPLATE if spec.kind == "retemplated" else tokenizer.CHAT_TEMPLATE
    model_config = train.llama_config(config.architecture, layers).to_dict()
    files.write_model(folder, weights[spec.name], model_config, template, config.architecture.max_positions)


def parent_of(spec: RevisionSpec) -> str:
    """The revision ``spec`` derives from; a recipe error if it names none."""
    if spec.parent is None:
        raise ZooError(f"revision {spec.name!r} of kind {spec.kind} needs a parent", where="zoo recipe")
    return spec.parent


def weights_for(config: ZooConfig, spec: RevisionSpec, weights: dict[str, Weights]) -> tuple[Weights, int]:
    """The revision's weights and layer count."""
    arch = config.architecture
    if spec.kind == "trained":
        model = train.new_model(arch, config.init_seed)
        train.train(model, schedule_of(spec))
        return _state(model), arch.num_layers
    parent = weights[parent_of(spec)]
    if spec.kind == "continued":
        model = train.new_model(arch, config.init_seed)
        model.load_state_dict(parent)
        torch.manual_seed(config.init_seed)
        train.train(model, schedule_of(spec))
        return _state(model), arch.num_layers
    if spec.kind == "widened":
        return widen(parent, config, spec.extra_layers), arch.num_layers + spec.extra_layers
    return parent, arch.num_layers


def schedule_of(spec: RevisionSpec) -> recipe.Schedule:
    """The training schedule of ``spec``; a recipe error if it has none."""
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


def write_adapter(folder: Path, config: ZooConfig, spec: RevisionSpec, base: Weights) -> None:
    """Train a LoRA on ``base`` per ``spec`` and write it as a PEFT adapter folder."""
    model = train.new_model(config.architecture, config.init_seed)
    model.load_state_dict(base)
    torch.manual_seed(config.init_seed + 2)
    adapters = train.attach_lora(model, spec.lora_rank, spec.lora_alpha)
    parameters = [p for lora in adapters.values() for p in (lora.lora_a, lora.lora_b)]
    train.train(model, schedule_of(spec), parameters)
    tensors: Weights = {}
    for module_path, lora in adapters.items():
        tensors[f"base_model.model.{module_path}.lora_A.weight"] = lora.lora_a
        tensors[f"base_model.model.{module_path}.lora_B.weight"] = lora.lora_b
    peft = files.peft_lora_config(spec.lora_rank, spec.lora_alpha, train.LORA_TARGETS, parent_of(spec))
    files.write_adapter(folder, tensors, peft)
