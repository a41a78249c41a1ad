"""A GGUF's tokenizer as a Hugging Face tokenizer.json and tokenizer_config.json (chat template included).

A GGUF keeps its tokenizer as metadata: `tokenizer.ggml.model` (its kind), `.pre` (how text is split
before the merges), `.tokens`, `.merges`, `.token_type` (3: a control token such as <|im_start|>),
the special ids and `tokenizer.chat_template`. Byte-level BPE (`gpt2`, what Llama-3, SmolLM, Qwen
and most recent models use) is rebuilt with the `tokenizers` library (the serve extra's), splitting
text as llama.cpp does for the file's `pre` name. Other kinds (sentencepiece `llama`, `t5`) and
unknown `pre` names get no tokenizer.json: the weights still load and token-id prompts still work.
(`pre = "smollm"` and starcoder's family split digits one by one, as llama.cpp and SmolLM's own
tokenizer.json do.) Built without transformers: the serve extra has `tokenizers`, not transformers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from prebake.artifacts.fsutil import write_bytes
from prebake.engine.bundled.runtime.gguf_file import GgufFile

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_CONTROL = 3
# llama.cpp's pre-tokenizer names -> how the text is split before the byte-level merges
_GPT2 = ("gpt2", "gpt-2", "default")
_DIGITS = ("smollm", "starcoder", "refact")
_LLAMA3 = ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3", "dbrx")
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def write_tokenizer(gguf: GgufFile, folder: Path, log: Callable[[str], None] = print) -> None:
    """Write tokenizer_config.json (special tokens, chat template) and, where the kind is known, tokenizer.json."""
    tokens = [str(t) for t in gguf.field("tokenizer.ggml.tokens", [])]
    config = _tokenizer_config(gguf, tokens)
    write_bytes(folder / TOKENIZER_CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True).encode() + b"\n")
    kind, pre = gguf.field("tokenizer.ggml.model"), gguf.field("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in (*_GPT2, *_DIGITS, *_LLAMA3):
        log(
            f"{gguf.path}: tokenizer {kind!r} (pre {pre!r}) is not converted: prebake rebuilds byte-level BPE "
            f"('gpt2'); serve token-id prompts, or put the model's own tokenizer.json in {folder}"
        )
        return
    tokenizer = _byte_level_bpe(gguf, tokens, pre, bool(config["add_bos_token"]))
    write_bytes(folder / TOKENIZER_FILE, tokenizer.to_str(pretty=False).encode())


def _tokenizer_config(gguf: GgufFile, tokens: list[str]) -> dict:
    def token(key: str) -> str | None:
        index = gguf.field(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    config = {
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": bool(gguf.field("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(gguf.field("tokenizer.ggml.add_eos_token", False)),
    }
    template = gguf.field("tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = str(template)
    return config


def _byte_level_bpe(gguf: GgufFile, tokens: list[str], pre: str, add_bos: bool):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    spelled = [t if set(t) <= alphabet else _byte_spelling(t) for t in tokens]
    merges = [_pair(str(m)) for m in gguf.field("tokenizer.ggml.merges", [])]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(spelled)}, merges=merges))
    if pre in _LLAMA3:
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(False, use_regex=False)])
    elif pre in _DIGITS:
        digits = pre_tokenizers.Digits(individual_digits=True)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([digits, pre_tokenizers.ByteLevel(False, use_regex=True)])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    types = gguf.field("tokenizer.ggml.token_type", [])
    control = [t for t, kind in zip(tokens, types, strict=False) if kind == _CONTROL and set(t) <= alphabet]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    bos = gguf.field("tokenizer.ggml.bos_token_id")
    if add_bos and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B:1", special_tokens=[(tokens[bos], bos)]
        )
    return tokenizer


def _pair(merge: str) -> tuple[str, str]:
    left, _, right = merge.partition(" ")
    return left, right


def _byte_spelling(token: str) -> str:
    """A token written in plain UTF-8 respelled in the byte-level alphabet (one printable char a byte)."""
    from tokenizers import pre_tokenizers

    return "".join(piece for piece, _ in pre_tokenizers.ByteLevel(False, use_regex=False).pre_tokenize_str(token))
