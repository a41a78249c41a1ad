"""Generated tokens to text, one token at a time: incremental decoding and stop strings.

A `TextStream` is fed each token as the scheduler samples it and answers the text that may be
shown now. It holds back what is not final yet: an incomplete UTF-8 sequence (decoded as U+FFFD
until its last byte arrives) and a tail that could still grow into a stop string. When a stop
string appears the text is cut before it and the stream says stop, so the scheduler ends that
request's row at once. Streamed deltas concatenate to exactly the non-streamed text. As vLLM's
detokenizer: stop strings are looked for only once more than `min_tokens` tokens were generated,
the stop token that ends an answer (EOS, stop_token_ids) adds no text, and `skip_special` (the
request's skip_special_tokens) leaves special tokens out of the text.
"""

from __future__ import annotations

from prebake.engine.bundled.runtime.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class TextStream:
    """One choice's text as its tokens arrive."""

    def __init__(
        self, tokenizer: Tokenizer | None, stop: tuple[str, ...] = (), min_tokens: int = 0, skip_special: bool = True
    ):
        self._tokenizer, self._stop = tokenizer, stop
        self._min_tokens, self._skip_special = min_tokens, skip_special
        self.tokens: list[int] = []
        self._shown: list[int] = []  # the tokens whose text is the answer's (not the stop token)
        self.stopped = False
        self._text = ""  # decoded so far (final part only)
        self._sent = 0  # characters of _text already handed out

    @property
    def text(self) -> str:
        return self._text

    def feed(self, token: int, stop_token: bool = False) -> str:
        """Add one token; the new text to show (maybe empty). Sets `stopped` on a stop string.
        A `stop_token` (the one that ends the answer) is counted but adds no text."""
        if self.stopped:
            return ""
        self.tokens.append(token)
        if stop_token or self._tokenizer is None:
            return ""
        self._shown.append(token)
        text = self._tokenizer.decode(self._shown, self._skip_special)
        if text.endswith(_REPLACEMENT):  # a multi-byte character is not complete yet
            return ""
        self._text = text
        if len(self.tokens) <= self._min_tokens:  # vLLM looks for stop strings only past min_tokens
            return self._take(final=False)
        for stop in self._stop:
            at = text.find(stop, max(0, self._sent - len(stop) + 1))
            if at != -1:
                self._text, self.stopped = text[:at], True
                break
        return self._take(final=self.stopped)

    def finish(self) -> str:
        """The held-back tail, once the request has ended."""
        if self._tokenizer is not None and not self.stopped:
            self._text = self._tokenizer.decode(self._shown, self._skip_special)
        return self._take(final=True)

    def _take(self, final: bool) -> str:
        end = len(self._text) if final else len(self._text) - self._held_back()
        delta = self._text[self._sent : max(end, self._sent)]
        self._sent = max(end, self._sent)
        return delta

    def _held_back(self) -> int:
        """Characters at the end that are the start of some stop string."""
        longest = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(self._text)), longest, -1):
                if self._text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
