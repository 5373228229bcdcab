"""POST /v1/completions: text and token-id prompts, streaming, stop strings, and the prompt cache
(cached_tokens when a prompt extends what a slot already holds)."""
from ferry_server import server  # noqa: F401 (fixture)


def test_text_prompt(server):
    r = server.client().completions.create(model="glm-5.3-flash", prompt="Once upon a time", max_tokens=8)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 8
    assert isinstance(r.choices[0].text, str)


def test_stream_matches_whole(server):
    client = server.client()
    whole = client.completions.create(model="glm-5.3-flash", prompt="The river", max_tokens=10)
    parts = list(client.completions.create(model="glm-5.3-flash", prompt="The river", max_tokens=10, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    assert [p.choices[0].finish_reason for p in parts if p.choices and p.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_token_id_prompt_and_ids_back(server):
    r = server.client().completions.create(model="glm-5.3-flash", prompt=[10, 20, 30, 40], max_tokens=6,
                                           extra_body={"return_token_ids": True, "ignore_eos": True})
    assert r.usage.prompt_tokens == 4
    assert r.usage.completion_tokens == 6
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].model_extra["token_ids"]) == 6
    assert r.choices[0].model_extra["prompt_token_ids"] == [10, 20, 30, 40]


def test_cached_prefix_is_reused_and_reported(server):
    client = server.client()
    prompt = list(range(100, 140))
    first = client.completions.create(model="glm-5.3-flash", prompt=prompt, max_tokens=5,
                                      extra_body={"return_token_ids": True, "ignore_eos": True})
    generated = first.choices[0].model_extra["token_ids"]
    # The slot holds the prompt and every generated token but the last (drawn, never fed back).
    follow_up = prompt + generated + [7, 8, 9]
    second = client.completions.create(model="glm-5.3-flash", prompt=follow_up, max_tokens=3,
                                       extra_body={"return_token_ids": True, "ignore_eos": True})
    assert second.usage.prompt_tokens_details.cached_tokens == len(prompt) + len(generated) - 1
    assert second.model_extra["timings"]["cache_n"] == len(prompt) + len(generated) - 1
    # The same tokens as computing the whole prompt afresh: the cache changes cost, not results.
    fresh = client.completions.create(model="glm-5.3-flash", prompt=follow_up, max_tokens=3,
                                      extra_body={"return_token_ids": True, "ignore_eos": True,
                                                  "cache_prompt": False})
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].model_extra["token_ids"] == second.choices[0].model_extra["token_ids"]


def test_stop_string(server):
    client = server.client()
    free = client.completions.create(model="glm-5.3-flash", prompt="Once upon a time", max_tokens=16,
                                     extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text[4:7]
    cut = client.completions.create(model="glm-5.3-flash", prompt="Once upon a time", max_tokens=16, stop=stop,
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
