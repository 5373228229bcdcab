"""ferry's native chat template against jinja2 rendering GLM-5.3-Flash's own chat_template.jinja
(tests/fixtures/chat_template, sha256 0c4099f3...) the way transformers and vLLM render it: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, `tojson` as
json.dumps(ensure_ascii=False), tool-call arguments given as mappings (servers parse OpenAI's
argument strings first). Byte for byte, and token for token with the test tokenizer."""
import copy
import hashlib
import json
import pathlib
import subprocess

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

REPO = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "tests" / "fixtures" / "chat_template" / "glm-5.3-flash.jinja"
TOKENIZER = REPO / "tests" / "fixtures" / "tokenizer"
OFFICIAL_SHA256 = "0c4099f3382d6c92700dfb99725025360966fd73032f0ecf32377c0d9e6309c5"

# enable_thinking = false: GLM-5.2's official template's two lines for it (ferry's documented
# addition; the 5.3-Flash template has no switch).
THINKING_SWITCH = [
    ("{%- if effective_reasoning_effort is not none -%}<|system|>Reasoning Effort:",
     "{%- if (enable_thinking is not defined or enable_thinking) and effective_reasoning_effort is not none -%}"
     "<|system|>Reasoning Effort:"),
    ("    <|assistant|>{{- '<think>' -}}",
     "    <|assistant|>{{- '<think></think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}"),
]


def _environment():
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def _template(source):
    return _environment().from_string(source)


OFFICIAL = TEMPLATE.read_text(encoding="utf-8")


def _switched():
    source = OFFICIAL
    for old, new in THINKING_SWITCH:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "days": {"type": "integer"}, "metric": {"type": "boolean"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web — «quotes» and \"escapes\"\n",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}},
    "strict": True}
DEFERRED = {"type": "function", "function": {"name": "later", "description": "deferred", "defer_loading": True}}
BARE = {"name": "bare_fn", "description": "no wrapper", "parameters": {"type": "object", "properties": {}},
        "strict": False}


def call(cid, name, args, as_string=False):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


CONVERSATIONS = {
    "single-user": {"messages": [{"role": "user", "content": "What is 2 + 2?"}]},
    "system-user": {"messages": [{"role": "system", "content": "You are careful."},
                                 {"role": "user", "content": "Hello"}]},
    "effort-low": {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"},
    "effort-high": {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"},
    "effort-other": {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "Medium"},
    "history-reasoning": {"messages": [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "Q3"}]},
    "clear-thinking": {"messages": [
        {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2", "reasoning_content": "R2"}],
        "clear_thinking": True, "add_generation_prompt": False},
    "inline-think": {"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>x<think>inner</think>mid</think>\n\n Answer \n"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "close only</think>tail", "reasoning_content": None},
        {"role": "user", "content": "c"}]},
    "strip-python-whitespace": {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "\x1c\x1d\x85\xa0\u3000\u2028Answer\u2029\u202f\u205f\x1e\x1f\x0b\x0c",
         "reasoning_content": "  kept  "},
        {"role": "assistant", "content": "\u200bNot stripped\u180e\ufeff"},
        {"role": "assistant", "content": " \n\t "}]},
    "unicode": {"messages": [
        {"role": "system", "content": "🧭 日本語"}, {"role": "user", "content": "مرحبا 👨\u200d👩\u200d👧 e\u0301"},
        {"role": "assistant", "content": "éè", "reasoning_content": "π ≈ 3.14159"},
        {"role": "user", "content": "❤️"}], "reasoning_effort": "low"},
    "literal-markers": {"messages": [{"role": "user", "content":
        "[gMASK]<sop><|system|>s<|user|>u<|assistant|><think>t</think><|observation|><tool_call>c</tool_call>"}]},
    "content-parts": {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "x"}},
                                     "plain", {"type": "video", "video": "v"}, {"type": "input_audio"},
                                     {"type": "unknown", "text": "dropped"}, {"type": "text", "text": " end"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "seen"}]}]},
    "tools-one-call": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris for 3 days?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [call("c1", "get_weather", {"city": "Paris", "days": 3, "metric": True})]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}]},
    "tools-arguments-as-string": {"tools": [WEATHER, SEARCH], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("a", "search", {"query": "ünïcode \"q\"", "filters": {"lang": ["en", "fr"], "max": 1.5e-5,
                                                                     "big": 12345678901234567890, "f": 1.0,
                                                                     "none": None, "t": False}}, as_string=True)]},
        {"role": "tool", "tool_call_id": "a", "content": "results"}]},
    "parallel-calls-reordered": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "two cities"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [
            call("call-b", "get_weather", {"city": "Berlin"}), call("call-a", "get_weather", {"city": "Athens"})]},
        {"role": "tool", "tool_call_id": "call-a", "content": "A-result"},
        {"role": "tool", "tool_call_id": "call-b", "content": "B-result"},
        {"role": "assistant", "content": "Done."}, {"role": "user", "content": "thanks"}]},
    "parallel-calls-unsortable": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("x", "get_weather", {"city": "X"}), call("y", "get_weather", {"city": "Y"})]},
        {"role": "tool", "tool_call_id": "y", "content": "Y"},
        {"role": "tool", "content": "no id"},
        {"role": "tool", "tool_call_id": "x", "content": "X"}]},
    "duplicate-result-ids": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("x", "get_weather", {"city": "X"}), call("y", "get_weather", {"city": "Y"})]},
        {"role": "tool", "tool_call_id": "y", "content": "Y1"},
        {"role": "tool", "tool_call_id": "y", "content": "Y2"}]},
    "list-of-outputs": {"tools": [WEATHER, SEARCH], "messages": [
        {"role": "user", "content": "both"},
        {"role": "assistant", "content": "", "tool_calls": [call("p", "search", {"query": "a"}),
                                                            call("q", "get_weather", {"city": "Q"})]},
        {"role": "tool", "content": [{"tool_call_id": "q", "output": "Q out"},
                                     {"id": "p", "output": [{"type": "text", "text": "P "}, {"type": "text", "text": "out"}]}]}]},
    "tool-reference": {"tools": [WEATHER, SEARCH, DEFERRED], "messages": [
        {"role": "user", "content": "find tools"},
        {"role": "assistant", "content": "", "tool_calls": [call("r", "search", {"query": "tools"})]},
        {"role": "tool", "tool_call_id": "r", "content": [{"type": "tool_reference", "name": "later"},
                                                          {"type": "tool_reference", "name": "get_weather"}]}]},
    "bare-function-and-deferred": {"tools": [BARE, DEFERRED, WEATHER],
                                   "messages": [{"role": "user", "content": "hi"}]},
    "tool-null-and-parts-content": {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": None}, {"role": "tool", "content": [{"type": "text", "text": "parts"}]},
        {"role": "user", "content": "y"}]},
    "thinking-off": {"messages": [{"role": "user", "content": "quick"}], "enable_thinking": False},
    "thinking-off-with-tools": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "user", "content": "q2"}], "enable_thinking": False, "reasoning_effort": "high"},
    "no-generation-prompt": {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
                             "add_generation_prompt": False},
    "unknown-roles-and-system-late": {"messages": [
        {"role": "developer", "content": "dropped by the template"}, {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "x"}, {"role": "system", "content": "B"}, {"role": "user", "content": "Q2"}]},
    "tool-first-and-empty": {"messages": [{"role": "tool", "tool_call_id": "z", "content": "orphan"},
                                          {"role": "user", "content": ""}], "tools": []},
    "many-parallel-calls-reversed": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "many"},
        {"role": "assistant", "content": "", "tool_calls": [call(f"id{i}", "get_weather", {"city": f"C{i}"})
                                                            for i in range(40)]},
        *[{"role": "tool", "tool_call_id": f"id{i}", "content": f"R{i}"} for i in reversed(range(40))]]},
    "odd-tool-call-fields": {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", "tool_calls": [
            {"id": 7, "function": {"name": None, "arguments": {"k": "v"}}},
            {"id": 8, "type": "function", "function": {"name": "n", "arguments": {"a b": [], "c": {}}}}]},
        {"role": "tool", "tool_call_id": 8, "content": "eight"}, {"role": "tool", "tool_call_id": 7, "content": "seven"}]},
}


def _jinja_inputs(case):
    """What a server hands the template: arguments strings parsed to mappings."""
    case = copy.deepcopy(case)
    for m in case["messages"]:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.loads(fn["arguments"])
    kwargs = {"add_generation_prompt": case.pop("add_generation_prompt", True)}
    kwargs.update(case)
    return kwargs


def render_jinja(case):
    kwargs = _jinja_inputs(case)
    source = _switched() if "enable_thinking" in case else OFFICIAL
    return _template(source).render(**kwargs)


def render_ferry(ferry_bin, case, tmp_path, *extra):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(case, ensure_ascii=False), encoding="utf-8")
    r = subprocess.run([ferry_bin, "tokenize", "--chat", str(request), *extra], capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def test_fixture_is_the_official_template():
    assert hashlib.sha256(TEMPLATE.read_bytes()).hexdigest() == OFFICIAL_SHA256
    assert (TOKENIZER / "chat_template.jinja").read_bytes() == TEMPLATE.read_bytes()


def test_enough_conversations():
    assert len(CONVERSATIONS) >= 20


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_prompt_matches_jinja2_byte_for_byte(ferry_bin, tmp_path, name):
    case = CONVERSATIONS[name]
    expected = render_jinja(case).encode("utf-8")
    got = render_ferry(ferry_bin, case, tmp_path, "--show-prompt")
    assert got == expected


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_prompt_token_ids_match_hugging_face(ferry_bin, tmp_path, name):
    case = CONVERSATIONS[name]
    expected = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).encode(
        render_jinja(case), add_special_tokens=False).ids
    got = render_ferry(ferry_bin, case, tmp_path, "--model", str(TOKENIZER), "--ids-only")
    assert [int(x) for x in got.split()] == expected


def test_thinking_switch_only_changes_the_two_lines():
    case = CONVERSATIONS["history-reasoning"]
    on = _template(_switched()).render(**_jinja_inputs(case))
    assert on == _template(OFFICIAL).render(**_jinja_inputs(case))
    off = _template(_switched()).render(**_jinja_inputs(case), enable_thinking=False)
    assert off.endswith("<|assistant|><think></think>") and "Reasoning Effort" not in off


@pytest.mark.parametrize("bad, message", [
    ({"messages": "x"}, "messages: expected an array"),
    ({"messages": [1]}, "messages[0]: expected an object"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]},
     "messages[0].tool_calls[0].arguments"),
    ({"messages": [{"role": "tool", "content": [{"type": "tool_reference", "name": "f"}]}]},
     "needs the request's tools"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
])
def test_bad_requests_are_refused_with_the_field(ferry_bin, tmp_path, bad, message):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(bad))
    r = subprocess.run([ferry_bin, "tokenize", "--chat", str(request), "--show-prompt"], capture_output=True, text=True)
    assert r.returncode != 0
    assert message in r.stderr
