"""Chat messages to a prompt through the model's chat template, rendered as transformers renders it."""

from __future__ import annotations

import json

import pytest

from prebake.artifacts.recipe.schema import ModelSpec, load_recipe
from prebake.engine.bundled.api.chat import TINY_TEMPLATE, ChatTemplate, ChatTemplateError, chat_template_for

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def _spec(weights: str) -> ModelSpec:
    return load_recipe("tiny-llama").model.model_copy(update={"weights": weights})


def test_a_random_weights_model_gets_the_small_template():
    template = chat_template_for(_spec("random"))
    assert template.source == TINY_TEMPLATE
    assert template.render(MESSAGES) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert not template.render(MESSAGES, add_generation_prompt=False).endswith("<|assistant|>\n")


def test_the_folders_template_with_bos_and_trimmed_blocks_renders_as_transformers_does(tmp_path):
    transformers = pytest.importorskip("transformers")
    source = (
        "{{ bos_token }}{% for m in messages %}\n"
        "  {% if m['role'] == 'system' %}[SYS]{{ m['content'] | tojson }}{% else %}[{{ m['role'] | upper }}]{{ m['content'] }}{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}"
    )
    config = {"chat_template": [{"name": "default", "template": source}], "bos_token": {"content": "<s>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = chat_template_for(_spec(str(tmp_path))).render(MESSAGES)
    from transformers.utils.chat_template_utils import render_jinja_template

    theirs = render_jinja_template([MESSAGES], chat_template=source, add_generation_prompt=True, bos_token="<s>")[0][0]
    assert ours == theirs
    assert transformers


def test_raise_exception_in_a_template_is_a_clear_error():
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render(MESSAGES)


def test_a_folder_without_a_template_has_none(tmp_path):
    assert chat_template_for(_spec(str(tmp_path))) is None


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if not enable_thinking | default(true) %}"
    "<think></think>{% endif %}{% endif %}"
)


@pytest.mark.parametrize("final", ["The capital is", "Paris, and  ", "  spaced"])
def test_continue_final_message_leaves_the_last_message_open_as_transformers_does(final):
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [*MESSAGES, {"role": "assistant", "content": final}]
    ours = ChatTemplate(CHATML).render(messages, add_generation_prompt=False, continue_final_message=True)
    theirs = render_jinja_template([messages], chat_template=CHATML, continue_final_message=True)[0][0]
    assert ours == theirs and not ours.endswith("<|im_end|>\n")


def test_chat_template_kwargs_reach_the_template_as_transformers_passes_them():
    from transformers.utils.chat_template_utils import render_jinja_template

    ours = ChatTemplate(CHATML).render(MESSAGES, variables={"enable_thinking": False})
    theirs = render_jinja_template([MESSAGES], chat_template=CHATML, add_generation_prompt=True, enable_thinking=False)
    assert ours == theirs[0][0] and ours.endswith("<think></think>")
    assert not ChatTemplate(CHATML).render(MESSAGES).endswith("<think></think>")


def test_continue_final_message_with_text_the_template_rewrote_is_a_clear_error():
    template = ChatTemplate("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="continue_final_message: the last message's text does not appear"):
        template.render([{"role": "assistant", "content": "lower"}], False, continue_final_message=True)
