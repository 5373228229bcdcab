"""POST /v1/chat/completions through the official openai client: whole and streamed answers, reasoning
on and off, usage and timings, token ids, a tool round trip, stop strings."""
import json

from ferry_server import chat_messages, server, tokenizer  # noqa: F401 (fixture)


def test_whole_answer_has_message_usage_and_timings(server):
    r = server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=12)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == "glm-5.3-flash"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens > 5
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    timings = r.model_extra["timings"]
    assert timings["predicted_n"] == r.usage.completion_tokens
    assert timings["prompt_ms"] >= 0 and timings["predicted_ms"] >= 0
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens


def test_stream_gives_the_same_answer_as_whole(server):
    client = server.client()
    kw = dict(model="glm-5.3-flash", messages=chat_messages("Tell me a story"), max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices)
    assert content == (whole.choices[0].message.content or "")
    assert reasoning == ((whole.choices[0].message.model_extra or {}).get("reasoning_content") or "")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    finishing = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finishing.model_extra["timings"]["predicted_n"] == whole.usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_token_ids_per_chunk_add_up_to_the_usage(server):
    stream = server.client().chat.completions.create(
        model="glm-5.3-flash", messages=chat_messages(), max_tokens=10, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
    ids, usage = [], None
    for c in stream:
        if c.choices:
            ids += c.choices[0].model_extra.get("token_ids") or []
        if c.usage:
            usage = c.usage
    assert len(ids) == usage.completion_tokens
    whole = server.client().chat.completions.create(
        model="glm-5.3-flash", messages=chat_messages(), max_tokens=10, extra_body={"return_token_ids": True})
    assert whole.choices[0].model_extra["token_ids"] == ids  # greedy: the same tokens
    assert len(whole.model_extra["prompt_token_ids"]) == whole.usage.prompt_tokens


def test_reasoning_on_and_off(server):
    client = server.client()
    on = client.chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=8,
                                        extra_body={"return_token_ids": True})
    off = client.chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=8,
                                         extra_body={"return_token_ids": True,
                                                     "chat_template_kwargs": {"enable_thinking": False}})
    tok = tokenizer()
    prompt_on = tok.decode(on.model_extra["prompt_token_ids"], skip_special_tokens=False)
    prompt_off = tok.decode(off.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert prompt_on.endswith("<|assistant|><think>")
    assert prompt_off.endswith("<|assistant|><think></think>")
    # Thinking on: the answer opens inside <think>, so what comes before </think> is reasoning.
    # Thinking off: generation starts as content.
    assert (on.choices[0].message.model_extra or {}).get("reasoning_content") or on.choices[0].message.content
    assert not (off.choices[0].message.model_extra or {}).get("reasoning_content")
    assert off.choices[0].message.content


def test_reasoning_effort_reaches_the_template(server):
    r = server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=1,
                                                extra_body={"return_token_ids": True, "reasoning_effort": "low"})
    prompt = tokenizer().decode(r.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert "Reasoning Effort: Low" in prompt


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_tool_round_trip(server):
    """call -> result -> answer. The tiny model's weights are random, so the call is the one a client
    would have received; what is checked is that each turn is rendered as GLM-5.3 expects and
    answered. (Parsing calls out of generated text is tested with scripted tokens in ferry_http_tests.)"""
    client = server.client()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="glm-5.3-flash", messages=messages, tools=[WEATHER],
                                           max_tokens=8, extra_body={"return_token_ids": True})
    tok = tokenizer()
    prompt = tok.decode(first.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    messages.append({"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]})
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'})
    second = client.chat.completions.create(model="glm-5.3-flash", messages=messages, tools=[WEATHER],
                                            max_tokens=8, extra_body={"return_token_ids": True})
    prompt = tok.decode(second.model_extra["prompt_token_ids"], skip_special_tokens=False)
    assert "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>" in prompt
    assert "<|observation|><tool_response>" in prompt and '{"temp_c": 21}' in prompt
    assert second.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_stop_string_cuts_the_answer(server):
    client = server.client()
    kw = dict(model="glm-5.3-flash", messages=chat_messages("Tell me a story"), max_tokens=16,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    free = client.chat.completions.create(**kw)
    text = free.choices[0].message.content
    assert len(text) > 6
    stop = text[3:6]
    cut = client.chat.completions.create(stop=[stop], **kw)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.usage.completion_tokens < free.usage.completion_tokens


def test_seeded_sampling_repeats(server):
    client = server.client()
    kw = dict(model="glm-5.3-flash", messages=chat_messages(), max_tokens=12, temperature=1.0, top_p=0.9,
              seed=1234, extra_body={"top_k": 50, "min_p": 0.01, "return_token_ids": True})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]


def test_developer_role_is_the_system_prompt(server):
    """Current OpenAI clients send instructions as role "developer": the prompt is the system one's."""
    client = server.client()
    def prompt_of(role):
        messages = [{"role": role, "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
        r = client.chat.completions.create(model="glm-5.3-flash", messages=messages, max_tokens=1,
                                           extra_body={"return_token_ids": True})
        return r.model_extra["prompt_token_ids"]
    developer = prompt_of("developer")
    assert developer == prompt_of("system")
    assert "<|system|>Answer in French." in tokenizer().decode(developer, skip_special_tokens=False)
