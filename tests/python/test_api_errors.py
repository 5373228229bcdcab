"""Bad input, fuzz-style: a few hundred malformed or invalid requests, each answered with a 4xx
OpenAI error object (naming the field where there is one), and the server keeps serving."""
import json
import random
import socket

from ferry_server import chat_messages, server  # noqa: F401 (fixture)

VALID_CHAT = {"model": "glm-5.3-flash", "messages": chat_messages(), "max_tokens": 2}

# (body, field the error must name or None)
INVALID = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({**VALID_CHAT, "temperature": -1}, "temperature"),
    ({**VALID_CHAT, "temperature": "warm"}, "temperature"),
    ({**VALID_CHAT, "top_p": 1.5}, "top_p"),
    ({**VALID_CHAT, "top_k": "many"}, "top_k"),
    ({**VALID_CHAT, "max_tokens": -5}, "max_tokens"),
    ({**VALID_CHAT, "max_tokens": 100000}, "max_tokens"),
    ({**VALID_CHAT, "n": 3}, "n"),
    ({**VALID_CHAT, "stop": [1, 2]}, "stop[0]"),
    ({**VALID_CHAT, "stream": 1}, "stream"),
    ({**VALID_CHAT, "tools": [{"type": "function"}]}, "tools[0].function"),
    ({**VALID_CHAT, "tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({**VALID_CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": "schema"}}]},
     "tools[0].function.parameters"),
    ({**VALID_CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({**VALID_CHAT, "logprobs": True}, "logprobs"),
    ({**VALID_CHAT, "seed": 1.5}, "seed"),
    ({**VALID_CHAT, "messages": [{"role": "user", "content": "x" * 30000}]}, "messages"),  # too long
]


def check_error(status, body, field=None):
    assert 400 <= status < 500, (status, body)
    err = json.loads(body)["error"]
    assert err["message"]
    assert err["type"]
    if field is not None:
        assert err["param"] == field, (field, err)


def test_invalid_requests_name_the_field(server):
    for body, field in INVALID:
        status, text = server.post("/v1/chat/completions", body)
        check_error(status, text, field)


def test_malformed_bodies(server):
    raws = [b"", b"{", b"}", b"[]", b"null", b"{\"messages\": [}", b"{\"messages\": tru}",
            b"{\"messages\": \"\xff\xfe\"}", b"{\"a\": 1}}", b"{\"a\": 01}", b"\x00\x01\x02",
            json.dumps(VALID_CHAT).encode()[:-1], json.dumps(VALID_CHAT).encode() + b"x"]
    for raw in raws:
        for path in ("/v1/chat/completions", "/v1/completions"):
            status, text = server.post(path, raw=raw)
            check_error(status, text)


def test_a_few_hundred_mutations_get_4xx_and_the_server_lives(server):
    rng = random.Random(1234)
    base = json.dumps(VALID_CHAT).encode()
    count = 0
    for i in range(300):
        raw = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            if not raw:
                break
            kind = rng.randrange(4)
            at = rng.randrange(len(raw))
            if kind == 0:
                del raw[at]
            elif kind == 1:
                raw.insert(at, rng.choice(b'{}[]",:\\0xe\xff'))
            elif kind == 2:
                raw[at] = rng.randrange(256)
            else:
                raw = raw[:at]
        try:
            json.loads(bytes(raw))
            continue  # still valid JSON: may well be a good request
        except (ValueError, UnicodeDecodeError):
            pass
        status, text = server.post("/v1/chat/completions", raw=bytes(raw))
        check_error(status, text)
        count += 1
    assert count > 200
    r = server.client().chat.completions.create(**VALID_CHAT)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_oversize_body_is_413(server):
    big = b'{"messages": [{"role": "user", "content": "' + b"a" * (17 << 20) + b'"}]}'
    status, text = server.post("/v1/chat/completions", raw=big)
    assert status == 413
    assert "max-body" in json.loads(text)["error"]["message"]


def test_unknown_paths_and_methods(server):
    check_error(*server.get("/v1/nothing"))
    status, text = server.get("/v1/chat/completions")
    assert status == 405
    check_error(status, text)
    status, text = server.request("DELETE", "/v1/models")
    assert status == 405


def test_garbage_http_is_answered_and_closed(server):
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 400")
    assert server.get("/health")[0] == 200
