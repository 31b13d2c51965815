"""The reference zoo served by vLLM on the CPU has the differences the gates exist to catch.

Uses the session fixtures: ``zoo_dir`` (the zoo, built once), ``zoo_eval`` (every revision served
and measured once) and ``vllm_stable`` (stable with the LoRA adapter, one server for the run).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from revgate.evaluation.records import RequestRecord
from revgate.evaluation.reference_task import TASK_SLICES, balanced_examples, is_correct
from revgate.zoo.evaluate import EVAL_DIR, RevisionReport, read_records
from revgate.zoo.index import load_revisions
from revgate.zoo.measure import chat, complete_batch
from revgate.zoo.recipe import REGRESSED_SLICE

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
SLOW_TPOT_RATIO = 1.8


def records(zoo_dir: Path, revision: str, kind: str = "") -> list[RequestRecord]:
    return read_records(zoo_dir / EVAL_DIR / f"{revision}{kind}.jsonl")


def test_improved_is_better_on_average_and_no_slice_is_worse(zoo_eval: dict[str, RevisionReport]) -> None:
    stable, improved = zoo_eval["stable"], zoo_eval["improved"]
    assert improved.overall.low > stable.overall.high, "improved is not clearly better on average"
    for name in TASK_SLICES:
        assert improved.slices[name].accuracy >= stable.slices[name].accuracy - 0.02, name
        assert improved.slices[name].high >= stable.slices[name].accuracy, f"improved measurably worse on {name}"


def test_slice_regressed_is_better_on_average_but_clearly_worse_on_its_slice(
    zoo_eval: dict[str, RevisionReport],
) -> None:
    stable, regressed = zoo_eval["stable"], zoo_eval["slice-regressed"]
    assert regressed.overall.accuracy > stable.overall.accuracy
    assert regressed.slices[REGRESSED_SLICE].high < stable.slices[REGRESSED_SLICE].low, "intervals overlap"


def test_slow_gives_the_same_outputs_as_stable(zoo_dir: Path, zoo_eval: dict[str, RevisionReport]) -> None:
    stable_texts = [r.output_text for r in records(zoo_dir, "stable")]
    slow_texts = [r.output_text for r in records(zoo_dir, "slow")]
    same = sum(a == b for a, b in zip(stable_texts, slow_texts, strict=True)) / len(stable_texts)
    assert same >= 0.99


def test_slow_is_slower_per_token_measured_side_by_side(zoo_eval: dict[str, RevisionReport]) -> None:
    # The eval alternates single streamed requests between each revision and stable, served together:
    # on shared cores other work moves latency by more than 2x within minutes, a paired ratio holds.
    # Same-architecture revisions measured 0.75x to 1.44x this way on a busy host; slow 3.5x.
    assert zoo_eval["slow"].tpot_ratio_vs_stable > SLOW_TPOT_RATIO


def test_latency_records_have_real_streamed_timings(zoo_dir: Path, zoo_eval: dict[str, RevisionReport]) -> None:
    timed = records(zoo_dir, "stable", ".latency")
    assert len(timed) >= 32
    for record in timed:
        assert record.output_tokens == 16
        assert record.ttft_s is not None and 0 < record.ttft_s < 30
        assert record.tpot_s is not None and record.tpot_s > 0


def test_template_changed_is_a_new_artifact_with_different_chat_outputs(
    zoo_dir: Path, zoo_eval: dict[str, RevisionReport]
) -> None:
    revisions = load_revisions(zoo_dir)
    assert revisions["template-changed"].artifact_digest != revisions["stable"].artifact_digest
    stable_weights = (zoo_dir / revisions["stable"].path / "model.safetensors").read_bytes()
    assert (zoo_dir / revisions["template-changed"].path / "model.safetensors").read_bytes() == stable_weights
    stable_chat = [r.output_text for r in records(zoo_dir, "stable", ".chat")]
    changed_chat = [r.output_text for r in records(zoo_dir, "template-changed", ".chat")]
    differ = sum(a != b for a, b in zip(stable_chat, changed_chat, strict=True)) / len(stable_chat)
    assert differ > 0.5
    assert zoo_eval["template-changed"].chat_accuracy < zoo_eval["stable"].chat_accuracy - 0.2
    # Completions bypass the chat template: same weights, same answers.
    assert [r.output_text for r in records(zoo_dir, "template-changed")] == [
        r.output_text for r in records(zoo_dir, "stable")
    ]


def test_stable_chat_equals_its_completion_answers(zoo_dir: Path, vllm_stable: Any) -> None:
    # The stable template is BOS + the message: chat and completion see the same tokens.
    for example in balanced_examples(77, 2):
        completion = complete_batch(vllm_stable.url, "stable", [example.prompt], 9)[0]
        assert chat(vllm_stable.url, "stable", example.prompt, 9).text == completion.text


def test_adapter_is_served_beside_stable_and_answers_differently(vllm_stable: Any) -> None:
    with urllib.request.urlopen(f"{vllm_stable.url}/v1/models", timeout=10) as response:  # noqa: S310 - local server
        served = {model["id"] for model in json.load(response)["data"]}
    assert {"stable", "adapter"} <= served
    prompts = [example.prompt for example in balanced_examples(99, 20)]
    base = complete_batch(vllm_stable.url, "stable", prompts, 9)
    adapted = complete_batch(vllm_stable.url, "adapter", prompts, 9)
    assert sum(a.text != b.text for a, b in zip(base, adapted, strict=True)) >= 5


def test_served_answers_match_the_trained_model_in_process(zoo_dir: Path, vllm_stable: Any) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from revgate.zoo.train import greedy_answers

    folder = zoo_dir / load_revisions(zoo_dir)["stable"].path
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(str(folder)))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    torch.set_num_threads(1)
    examples = balanced_examples(55, 20)
    local = greedy_answers(model, [e.prompt for e in examples])
    served = complete_batch(vllm_stable.url, "stable", [e.prompt for e in examples], 9)
    agree = sum(is_correct(s.text, a) or s.text.strip() == a for s, a in zip(served, local, strict=True))
    assert agree / len(examples) >= 0.95


def test_models_make_is_deterministic_and_reuses_its_cache(tmp_path: Path) -> None:
    def make(out: Path) -> str:
        command = [sys.executable, "-m", "revgate.cli.main", "models", "make", str(out), "--scale", "0.01"]
        return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600).stdout

    make(tmp_path / "a")
    make(tmp_path / "b")
    index_a = json.loads((tmp_path / "a" / "zoo.json").read_text())
    index_b = json.loads((tmp_path / "b" / "zoo.json").read_text())
    digests_a = {name: rev["artifact_digest"] for name, rev in index_a["revisions"].items()}
    assert digests_a == {name: rev["artifact_digest"] for name, rev in index_b["revisions"].items()}
    assert len(set(digests_a.values())) == len(digests_a)
    assert "reusing" in make(tmp_path / "a")
