"""Streaming text: deltas concatenate to the whole text, stop strings cut it and end the row."""

from __future__ import annotations

from prebake.engine.bundled.api.text import TextStream
from prebake.engine.bundled.runtime.tokenizer import ByteTokenizer

TOK = ByteTokenizer(512)


def _run(text: bytes | list[int], stop: tuple[str, ...] = ()) -> tuple[list[str], TextStream, int]:
    stream = TextStream(TOK, stop)
    deltas, fed = [], 0
    for token in text:
        fed += 1
        deltas.append(stream.feed(token))
        if stream.stopped:
            break
    deltas.append(stream.finish())
    return deltas, stream, fed


def test_deltas_concatenate_to_the_whole_decoded_text():
    deltas, stream, _ = _run("héllo wörld".encode())
    assert "".join(deltas) == "héllo wörld" == stream.text
    assert "\ufffd" not in "".join(deltas)  # a multi-byte character is held until it is complete


def test_a_stop_string_cuts_the_text_before_it_and_says_stop_at_once():
    deltas, stream, fed = _run(b"one two STOP three", stop=("STOP",))
    assert stream.stopped and stream.text == "one two " and "".join(deltas) == "one two "
    assert fed == len(b"one two STOP")  # the row ends at the token that completed the stop string


def test_text_that_may_start_a_stop_string_is_held_back_then_released():
    stream = TextStream(TOK, ("ab!",))
    assert stream.feed(ord("x")) == "x"
    assert stream.feed(ord("a")) == ""  # could be the start of "ab!"
    assert stream.feed(ord("b")) == ""
    assert stream.feed(ord("c")) == "abc"  # it was not
    assert stream.finish() == "" and not stream.stopped


def test_the_earliest_of_several_stop_strings_wins_and_ids_past_bytes_stay_visible():
    deltas, stream, _ = _run([*b"x", 300, *b"yz END"], stop=("z", "END"))
    assert stream.text == "x<|300|>y"


def test_without_a_tokenizer_only_tokens_are_collected():
    stream = TextStream(None, ("a",))
    assert stream.feed(97) == "" and stream.tokens == [97] and not stream.stopped


def test_stop_strings_are_looked_for_only_past_min_tokens():
    stream = TextStream(TOK, ("b",), min_tokens=3)
    assert [stream.feed(t) for t in b"abc"] == ["a", "b", "c"] and not stream.stopped
    assert stream.feed(ord("b")) == "" and stream.stopped and stream.text == "abc"


def test_the_stop_token_that_ends_an_answer_adds_no_text():
    stream = TextStream(TOK)
    assert stream.feed(ord("a")) == "a"
    assert stream.feed(300, stop_token=True) == "" and stream.tokens == [97, 300]
    assert stream.finish() == "" and stream.text == "a"
