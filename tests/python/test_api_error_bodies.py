"""Every error body is valid JSON, whatever bytes the request carried (a URL with invalid UTF-8, a
megabyte-long value), and its message stays short (temperature 1e300 does not come back as 300
digits)."""
import json
import socket

import openai
import pytest

from ferry_server import chat_messages, server  # noqa: F401 (fixture)


def raw_request(server, request_line, body=b""):
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request_line + b"\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


@pytest.mark.parametrize("request_line", [
    b"GET /\xff\xfe HTTP/1.1",
    b"POST /v1/requests/\xff/cancel HTTP/1.1",
    b"POST /slots/\xff HTTP/1.1",
    b"POST /slots/0?action=\xff HTTP/1.1",
    b"PUT /v1/chat/\xc3 HTTP/1.1",
    b"DELETE /health\xed\xa0\x80 HTTP/1.1",
])
def test_invalid_utf8_in_the_url_gives_a_json_error(server, request_line):
    status, payload = raw_request(server, request_line)
    assert 400 <= status < 500
    error = json.loads(payload.decode("utf-8"))["error"]  # strict: raises on invalid UTF-8
    assert error["message"] and error["type"]


def test_long_values_are_not_echoed_whole(server):
    messages = json.dumps(chat_messages()).encode()
    malformed = b'{"messages": ' + messages + b', "stream_options": {"' + b"k" * 200_000 + b'": tru}}'
    status, payload = raw_request(server, b"POST /v1/chat/completions HTTP/1.1", malformed)
    assert status == 400 and len(payload) < 4096
    assert json.loads(payload)["error"]["code"] == "invalid_json"
    status, payload = raw_request(server, b"POST /v1/chat/completions HTTP/1.1",
                                  json.dumps({"model": "m" * 100_000, "messages": chat_messages()}).encode())
    assert status == 404 and len(payload) < 4096
    assert json.loads(payload)["error"]["code"] == "model_not_found"


def test_absurd_numbers_get_short_messages(server):
    client = server.client()
    for field, value in [("temperature", 1e300), ("top_p", -1e308), ("min_p", 1e300)]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=1,
                                           extra_body={field: value})
        error = e.value.body
        assert error["param"] == field
        assert len(error["message"]) < 80, error["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), temperature=1e300)
    assert e.value.body["message"] == "temperature = 1e+300: expected a number in [0, 2]"
