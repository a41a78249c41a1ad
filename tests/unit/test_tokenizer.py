"""Tokenizers: a folder's tokenizer.json encodes as transformers does; random models get bytes."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.tokenizer import ByteTokenizer, HFTokenizer, TokenizerError, tokenizer_for

CONFIG = {"vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
TEXT = "the quick brown fox jumps over the lazy dog; the dog sleeps"


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A small BPE tokenizer.json with a BOS-adding post-processor, as Llama's has."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [TEXT] * 20,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.decoder = decoders.ByteLevel()
    folder = tmp_path_factory.mktemp("model")
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_a_folders_tokenizer_json_encodes_and_decodes_as_transformers_does(tokenizer_json):
    ours = HFTokenizer(tokenizer_json / "tokenizer.json")
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json / "tokenizer.json"), bos_token="<s>")
    ids = ours.encode("the lazy fox sleeps")
    assert ids == theirs("the lazy fox sleeps")["input_ids"]
    assert ids[0] == theirs.bos_token_id
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True) == "the lazy fox sleeps"


def test_the_byte_tokenizer_round_trips_utf8_and_shows_ids_beyond_bytes():
    tok = ByteTokenizer(1024)
    ids = tok.encode("héllo, wörld ✓")
    assert all(0 <= i < 256 for i in ids) and len(ids) == len("héllo, wörld ✓".encode())
    assert tok.decode(ids) == "héllo, wörld ✓"
    assert tok.decode([104, 105, 700, 33]) == "hi<|700|>!"


def test_a_vocabulary_smaller_than_a_byte_gets_no_byte_tokenizer():
    with pytest.raises(TokenizerError, match="at least 256 ids, the model has 100"):
        ByteTokenizer(100)


def test_each_kind_of_model_gets_its_tokenizer(tokenizer_json, tmp_path):
    assert isinstance(tokenizer_for(ModelSpec(name="m", config=CONFIG), 1024), ByteTokenizer)
    assert isinstance(tokenizer_for(ModelSpec(name="m", weights=str(tokenizer_json), config=CONFIG), 1024), HFTokenizer)
    assert tokenizer_for(ModelSpec(name="m", weights=str(tmp_path), config=CONFIG), 1024) is None


def test_a_malformed_tokenizer_json_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot read the tokenizer .*tokenizer.json"):
        HFTokenizer(tmp_path / "tokenizer.json")


def test_special_tokens_are_written_only_when_not_skipped(tokenizer_json):
    from prebake.engine.bundled.api.text import TextStream

    ours = HFTokenizer(tokenizer_json / "tokenizer.json")
    ids = ours.encode("the dog") + [ours._tok.token_to_id("</s>")] + ours.encode("the fox", special=False)
    assert ours.decode(ids) == "the dogthe fox"
    assert "</s>" in ours.decode(ids, skip_special=False) and "<s>" in ours.decode(ids, skip_special=False)
    skipped, kept = TextStream(ours), TextStream(ours, skip_special=False)
    for token in ids:
        skipped.feed(token), kept.feed(token)
    assert skipped.finish() is not None and skipped.text == "the dogthe fox"
    kept.finish()
    assert kept.text == ours.decode(ids, skip_special=False)
