"""Prefix stability of GLM-5.3-Flash's chat template for the prefix cache: the tokens a turn ran
(its prompt, then the answer as drawn) against the next request's prompt, with the real tokenizer
(tests/fixtures/tokenizer). The cache resumes at the longest checkpoint whose tokens begin the new
prompt, so what matters is where the two first differ:
- the previous prompt is always a prefix of the next one (the checkpoint one token before its end hits);
- an answer's reasoning is rendered back only when the client sends reasoning_content (or the
  reasoning inside content): without it the template writes <think></think> in its place, and the
  sequence diverges at the first drawn token;
- content is rendered stripped, so whitespace the model drew after </think> is not in the history;
- a tool call is rendered from the parsed call: drawn in the template's own form (no whitespace around
  the tags, string values as they are) it comes back token for token; other whitespace, or a
  non-string value the template writes back through tojson, diverges there.
Each case asserts the first token where the drawn sequence and the next prompt differ."""
import json
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "tokenizer"
SYSTEM = "You are a weather assistant."
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def ids(ferry_bin, tmp_path, messages, tools=None, generation=True):
    request = tmp_path / "chat.json"
    body = {"messages": messages, "add_generation_prompt": generation}
    if tools:
        body["tools"] = tools
    request.write_text(json.dumps(body), encoding="utf-8")
    r = subprocess.run([ferry_bin, "tokenize", "--chat", str(request), "--model", str(TOKENIZER), "--ids-only"],
                       capture_output=True, check=True)
    return [int(x) for x in r.stdout.split()]


def text_ids(ferry_bin, text):
    r = subprocess.run([ferry_bin, "tokenize", "--model", str(TOKENIZER), "--ids-only", text], capture_output=True,
                       check=True)
    return [int(x) for x in r.stdout.split()]


def first_difference(a, b):
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def turn(ferry_bin, tmp_path, drawn_text, assistant, tools=None, follow=None):
    """(length of the first prompt, where the drawn sequence and the next prompt first differ)."""
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
    prompt = ids(ferry_bin, tmp_path, first, tools)
    drawn = prompt + text_ids(ferry_bin, drawn_text)
    follow = follow or [{"role": "user", "content": "And tomorrow?"}]
    following = ids(ferry_bin, tmp_path, first + [assistant] + follow, tools)
    assert following[:len(prompt)] == prompt  # the previous prompt is a prefix: its checkpoint hits
    return len(prompt), first_difference(drawn, following)


def test_reasoning_sent_back_keeps_the_whole_answer(ferry_bin, tmp_path):
    n, at = turn(ferry_bin, tmp_path, "Look it up.</think>It is sunny.",
                 {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Look it up."})
    assert at == n + len(text_ids(ferry_bin, "Look it up.</think>It is sunny."))


def test_reasoning_dropped_diverges_at_the_first_drawn_token(ferry_bin, tmp_path):
    n, at = turn(ferry_bin, tmp_path, "Look it up.</think>It is sunny.",
                 {"role": "assistant", "content": "It is sunny."})
    assert at == n


def test_whitespace_after_think_is_stripped_from_the_history(ferry_bin, tmp_path):
    n, at = turn(ferry_bin, tmp_path, "Look it up.</think>\n\nIt is sunny.",
                 {"role": "assistant", "content": "\n\nIt is sunny.", "reasoning_content": "Look it up."})
    assert at == n + len(text_ids(ferry_bin, "Look it up.</think>"))


def test_tool_call_rendered_from_the_parsed_call(ferry_bin, tmp_path):
    drawn = "Call the tool.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    call = {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]}
    n, at = turn(ferry_bin, tmp_path, drawn, call, TOOLS,
                 follow=[{"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 14}"}])
    assert at == n + len(text_ids(ferry_bin, drawn))  # the whole call comes back as drawn
    spaced = drawn.replace("<arg_key>", " <arg_key>")
    n, at = turn(ferry_bin, tmp_path, spaced, call, TOOLS,
                 follow=[{"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 14}"}])
    assert at == n + first_difference(text_ids(ferry_bin, spaced), text_ids(ferry_bin, drawn))
    assert at < n + len(text_ids(ferry_bin, spaced))
