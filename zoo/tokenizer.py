"""The byte-level tokenizer every zoo model shares: 3 special tokens, then one token per byte.

Token id = 3 + byte value, so training can encode text without the tokenizer library and the
files written here decode the same ids the same way for vLLM.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.pre_tokenizers import ByteLevel

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_TOKENS = (PAD, BOS, EOS)
VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

# The stable chat template: BOS, then the last user message as-is, so a chat request and a
# completion request with the same text reach the model as the same tokens.
CHAT_TEMPLATE = "{{ bos_token }}{{ messages[-1]['content'] }}"
# The template-changed revision wraps the message in role markers the model never saw in training.
CHANGED_CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"


def encode(text: str) -> list[int]:
    """Byte token ids of ``text`` (no special tokens)."""
    return [len(SPECIAL_TOKENS) + byte for byte in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    """Text of byte token ids; special tokens are dropped."""
    data = bytes(i - len(SPECIAL_TOKENS) for i in ids if i >= len(SPECIAL_TOKENS))
    return data.decode("utf-8", errors="replace")


def build_tokenizer() -> Tokenizer:
    """A ``tokenizers`` byte-level BPE with no merges that adds BOS in front of every input."""
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    # alphabet() is unordered; order the vocabulary by byte value so ids match encode().
    table = _bytes_to_unicode()
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({table[byte]: len(SPECIAL_TOKENS) + byte for byte in range(256)})
    assert set(table.values()) == set(byte_chars)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tokenizer


def tokenizer_json() -> bytes:
    """The bytes of ``tokenizer.json``."""
    data = json.loads(build_tokenizer().to_str())
    return (json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def tokenizer_config(chat_template: str, max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: the special tokens and the chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "chat_template": chat_template,
    }


def special_tokens_map() -> dict[str, str]:
    """``special_tokens_map.json``."""
    return {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table, which ByteLevel uses.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars, strict=True)}
