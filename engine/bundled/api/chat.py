"""Chat messages to one prompt through the model's chat template, rendered as transformers does.

The template is `chat_template` from the model folder's tokenizer_config.json (a string, or a
list of named templates of which "default" is taken), else chat_template.jinja beside it.
Models with random weights (tiny-llama) have no folder and get `TINY_TEMPLATE`, which writes
each message as <|role|>, a newline, its text and a newline. Rendering follows transformers'
`apply_chat_template`: a sandboxed jinja2 environment with trim_blocks and lstrip_blocks, the
`raise_exception` global and a `tojson` filter, variables messages, add_generation_prompt,
bos_token and eos_token (and a request's chat_template_kwargs); the rendered text is tokenized
without adding special tokens again.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.recipe.schema import ModelSpec

TINY_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class ChatTemplateError(PrebakeError, ValueError):
    """The model has no usable chat template, or the messages do not fit it."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    bos_token: str = ""
    eos_token: str = ""

    def render(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        variables: dict | None = None,
    ) -> str:
        """The prompt text; `variables` are more template variables (vLLM's chat_template_kwargs);
        `continue_final_message` cuts the text right after the last message's content, so the
        model continues that message instead of closing it (transformers' rule)."""
        try:
            text = _compiled(self.source).render(
                **(variables or {}),
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as exc:  # raise_exception() in the template lands here too
            raise ChatTemplateError(f"the model's chat template refused these messages: {exc}") from exc
        return _open_final(text, messages[-1]["content"]) if continue_final_message else text


def _open_final(text: str, final: str) -> str:
    """`text` cut after the final message's content (its trailing spaces kept only where the template kept them)."""
    if not final.strip() or final.strip() not in text:
        raise ChatTemplateError(
            "continue_final_message: the last message's text does not appear in the rendered prompt "
            "(the template rewrote it, or it is empty); send it as the template writes it, or leave the option out"
        )
    at = text.rindex(final.strip())
    kept = final.lstrip()
    return text[: at + len(kept)] if text[at : at + len(kept)] == kept else text[: at + len(final.strip())]


def chat_template_for(spec: ModelSpec, folder: Path | None = None) -> ChatTemplate | None:
    """The recipe model's chat template, from `folder` (else the one its weights name); None when the
    folder has none (chat is then refused)."""
    if spec.random_weights:
        return ChatTemplate(TINY_TEMPLATE)
    folder = folder or Path(spec.weights).expanduser()
    config: dict = {}
    config_path = folder / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ChatTemplateError(f"cannot read {config_path}: {exc}; restore the model's own file") from exc
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if source is None and (folder / "chat_template.jinja").is_file():
        source = (folder / "chat_template.jinja").read_text()
    if not isinstance(source, str):
        return None
    return ChatTemplate(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))


def _token_text(value) -> str:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> jinja2.Template:
    return _environment().from_string(source)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env
