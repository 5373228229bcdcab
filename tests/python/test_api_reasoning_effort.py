"""reasoning_effort as current OpenAI clients send it: one of the levels, "none" and "minimal" turning
thinking off (the prompt ends with an empty <think></think>, no "Reasoning Effort" line), anything else
a 400 naming the field."""
import openai
import pytest

from ferry_server import chat_messages, server, tokenizer  # noqa: F401 (fixture)


def prompt_text(server, **kw):
    r = server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=1,
                                                extra_body={"return_token_ids": True, **kw.pop("extra_body", {})}, **kw)
    return tokenizer().decode(r.model_extra["prompt_token_ids"], skip_special_tokens=False)


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_none_and_minimal_turn_thinking_off(server, effort):
    prompt = prompt_text(server, reasoning_effort=effort)
    assert prompt.endswith("<|assistant|><think></think>"), prompt
    assert "Reasoning Effort" not in prompt
    assert prompt == prompt_text(server, extra_body={"chat_template_kwargs": {"enable_thinking": False}})


@pytest.mark.parametrize("effort, line", [("low", "Low"), ("high", "High"), ("medium", "Max"), ("xhigh", "Max")])
def test_other_levels_think_at_their_level(server, effort, line):
    prompt = prompt_text(server, reasoning_effort=effort)
    assert f"Reasoning Effort: {line}" in prompt
    assert prompt.endswith("<|assistant|><think>")


@pytest.mark.parametrize("effort", ["extreme", "HIGH", ""])
def test_unknown_levels_are_refused(server, effort):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=1,
                                                reasoning_effort=effort)
    assert e.value.body["param"] == "reasoning_effort"


def test_none_with_thinking_forced_on_is_a_contradiction(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=1,
                                                reasoning_effort="none",
                                                extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert e.value.body["param"] == "reasoning_effort"
