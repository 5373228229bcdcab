"""The prefix cache over HTTP with the official openai client: cached_tokens (and llama.cpp's
timings.cache_n) on every response, growing across the turns of a conversation; the same request again
computes only its last token even after another conversation took the slot; cache_prompt false and a
released slot compute the whole prompt; and a cached answer equals the uncached one (greedy)."""
import json

import pytest

from ferry_server import FerryServer

SYSTEM = ("You are a careful assistant. Answer in short sentences, cite the documents you were given, "
          "and say when you do not know something. Keep a list of the facts the user tells you. ") * 3


@pytest.fixture(scope="module")
def one_slot(ferry_bin):
    """One slot, so that every other conversation takes it from the previous one."""
    s = FerryServer(ferry_bin, "--temperature", "0", "--slots", "1", "--checkpoint-every", "64")
    yield s
    assert s.stop() == 0, s.output()


def cached(resp):
    details = resp.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    timings = resp.model_extra.get("timings") or {}
    assert timings.get("cache_n") == details.cached_tokens
    return details.cached_tokens


def chat(client, messages, **kw):
    return client.chat.completions.create(model="glm-5.3-flash", messages=messages, max_tokens=8,
                                          extra_body={"ignore_eos": True, **kw.pop("extra_body", {})}, **kw)


def assistant_turn(resp, with_reasoning):
    m = resp.choices[0].message
    turn = {"role": "assistant", "content": m.content or ""}
    reasoning = (m.model_extra or {}).get("reasoning_content")
    if with_reasoning and reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


@pytest.mark.parametrize("with_reasoning", [True, False])
def test_cached_tokens_grow_across_turns_and_survive_another_conversation(one_slot, with_reasoning):
    client = one_slot.client()
    messages = [{"role": "system", "content": f"Conversation {with_reasoning}. " + SYSTEM},
                {"role": "user", "content": "My name is Ada."}]
    prev = chat(client, messages)
    assert cached(prev) == 0
    seen = [0]
    for text in ["I live in Lyon.", "What is my name?", "Where do I live?"]:
        messages += [assistant_turn(prev, with_reasoning), {"role": "user", "content": text}]
        # Another conversation takes the only slot between the turns.
        other = chat(client, [{"role": "user", "content": "Tell me about " + text * 20}])
        assert other.usage.prompt_tokens > 64
        resp = chat(client, messages)
        c = cached(resp)
        if with_reasoning:
            # The history renders the answer as it was drawn: the turn resumes at the end of generation.
            assert c == prev.usage.prompt_tokens + prev.usage.completion_tokens - 1, (seen, resp.usage)
        else:
            # Without reasoning_content the template writes <think></think> where the reasoning was:
            # the turn resumes at the previous prompt's checkpoint (all of it but its last token).
            assert c == prev.usage.prompt_tokens - 1, (seen, resp.usage)
        assert seen[-1] < c < resp.usage.prompt_tokens
        seen.append(c)
        prev = resp


def test_same_request_again_is_cached_and_answers_the_same(one_slot):
    client = one_slot.client()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count to ten."}]
    a = chat(client, messages)
    chat(client, [{"role": "user", "content": "Something else entirely, " * 30}])
    b = chat(client, messages)
    assert cached(b) == b.usage.prompt_tokens - 1
    assert b.choices[0].message.content == a.choices[0].message.content
    off = chat(client, messages, extra_body={"cache_prompt": False})
    assert cached(off) == 0
    assert off.choices[0].message.content == a.choices[0].message.content


def test_streaming_usage_reports_cached_tokens(one_slot):
    client = one_slot.client()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Stream this."}]
    chat(client, messages)
    stream = chat(client, messages, stream=True, stream_options={"include_usage": True})
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_release_frees_the_slots_checkpoints(one_slot):
    client = one_slot.client()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Release me."}]
    chat(client, messages)
    status, body = one_slot.post("/slots/0?action=release")
    assert status == 200 and json.loads(body)["released"] is True
    again = chat(client, messages)
    assert cached(again) == 0
