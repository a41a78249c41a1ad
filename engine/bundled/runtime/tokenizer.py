"""Text to token ids and back: a model folder's tokenizer.json, or bytes for seeded random models.

    HFTokenizer     <model folder>/tokenizer.json through the `tokenizers` library, with the
                    special tokens (BOS) its post-processor adds, as transformers would encode
    ByteTokenizer   for `weights = "random"` recipes (tiny-llama): token i < 256 is byte i, so
                    any UTF-8 text round-trips; ids from 256 up have no text and are shown as
                    <|id|> so that a random model's output stays visible

A model folder without tokenizer.json gets no tokenizer: token-id prompts still work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.recipe.schema import ModelSpec

TOKENIZER_FILE = "tokenizer.json"


class TokenizerError(PrebakeError, ValueError):
    """A tokenizer could not be loaded, or a text does not fit the model's vocabulary."""


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str, special: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special: bool = True) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; other ids decode to <|id|>."""

    name = "bytes"

    def __init__(self, vocab_size: int):
        if vocab_size < 256:
            raise TokenizerError(
                f"a byte-level tokenizer needs a vocabulary of at least 256 ids, the model has "
                f"{vocab_size}; send token-id prompts or give the model a tokenizer.json"
            )

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """Bytes as text; every other id as <|id|> (it has no special tokens to skip)."""
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append(f"<|{i}|>")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """A Hugging Face tokenizer.json."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _Tokenizer

        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(
                f"cannot read the tokenizer {path}: {exc}; replace it with the model's own tokenizer.json"
            ) from exc
        self.name = str(path)

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids; `special=False` leaves out BOS and the like (a chat template writes its own)."""
        return self._tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        """Text; `skip_special=False` writes special tokens (EOS, chat markers) too, as vLLM's skip_special_tokens."""
        return self._tok.decode(ids, skip_special_tokens=skip_special)


def tokenizer_for(spec: ModelSpec, vocab_size: int, folder: Path | None = None) -> Tokenizer | None:
    """The tokenizer of a recipe's model: tokenizer.json of its folder (`folder`, else the one its
    weights name), bytes for random weights, else None."""
    if spec.random_weights:
        return ByteTokenizer(vocab_size)
    path = (folder or Path(spec.weights).expanduser()) / TOKENIZER_FILE
    return HFTokenizer(path) if path.is_file() else None
