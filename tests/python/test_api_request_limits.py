"""Limits that only make sense together: min_tokens may not exceed max_tokens (or
max_completion_tokens); within them, min_tokens is honoured."""
import openai
import pytest

from ferry_server import chat_messages, server  # noqa: F401 (fixture)


def test_min_tokens_above_max_tokens_is_refused(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=3,
                                       extra_body={"min_tokens": 4})
    assert e.value.body["param"] == "min_tokens"
    assert e.value.body["message"] == "min_tokens = 4 is more than max_tokens = 3"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="glm-5.3-flash", prompt="x", extra_body={"max_completion_tokens": 1,
                                                                               "min_tokens": 2})


def test_min_tokens_up_to_max_tokens_is_honoured(server):
    r = server.client().completions.create(model="glm-5.3-flash", prompt=[5, 6], max_tokens=5,
                                           extra_body={"min_tokens": 5})
    assert r.usage.completion_tokens == 5
