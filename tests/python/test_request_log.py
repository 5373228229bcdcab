"""The log line each request ends with: with --log-format json every line of the log is one JSON
object, and a request's carries its id, slot, tokens, cached tokens, times and finish reason at the
top level; with text it reads as one sentence."""
import json
import time

from ferry_server import FerryServer


def json_records(output):
    records = [json.loads(line) for line in output.splitlines() if line.strip()]  # every line is JSON
    for r in records:
        assert r["time"].endswith("Z") and r["level"] in ("info", "warning", "error", "debug")
    return records


def wait_for(server, pred, timeout=10):
    deadline = time.monotonic() + timeout
    while not pred(server.output()):
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    return server.output()


def test_json_log_has_a_line_per_request(ferry_bin):
    s = FerryServer(ferry_bin, "--log-format", "json", "--temperature", "0")
    try:
        client = s.client()
        first = client.completions.create(model="glm-5.3-flash", prompt=[11, 12, 13, 14, 15], max_tokens=1)
        # The first prompt and one token more: its slot holds the first prompt, 5 cached tokens.
        client.completions.create(model="glm-5.3-flash", prompt=[11, 12, 13, 14, 15, 16], max_tokens=3,
                                  extra_body={"ignore_eos": True})
        assert s.post("/v1/completions", {"prompt": "hi", "max_tokens": 5000})[0] == 400
        output = wait_for(s, lambda out: out.count('"event":"request"') >= 3)
    finally:
        assert s.stop() == 0
    records = json_records(output)
    assert any("listening on" in r.get("msg", "") for r in records)
    requests = [r for r in records if r.get("event") == "request"]
    a, b, bad = requests
    assert a["id"] == first.id and a["endpoint"] == "completions" and a["slot"] == 0
    assert (a["prompt_tokens"], a["cached_tokens"], a["completion_tokens"]) == (5, 0, 1)
    assert a["finish_reason"] in ("length", "stop") and a["status"].startswith("finished_")
    for key in ("queue_ms", "prompt_ms", "predicted_ms", "ttft_ms", "total_ms", "decode_tokens_per_s"):
        assert isinstance(a[key], (int, float)) and a[key] >= 0
    assert a["ttft_ms"] <= a["total_ms"]
    assert b["cached_tokens"] == 5 and b["slot"] == 0 and b["completion_tokens"] == 3
    assert b["decode_tokens_per_s"] > 0 and b["finish_reason"] == "length"
    assert bad["status"] == "invalid_request" and bad["slot"] == -1 and "max_tokens" in bad["message"]


def test_text_log_line(ferry_bin):
    s = FerryServer(ferry_bin)
    try:
        r = s.client().completions.create(model="glm-5.3-flash", prompt="hi", max_tokens=2)
        output = wait_for(s, lambda out: f"request {r.id} (completions): slot 0" in out)
    finally:
        assert s.stop() == 0
    line = next(l for l in output.splitlines() if f"request {r.id}" in l)
    assert "[request] [info]" in line and "completion 2 tokens" in line and "finish length" in line
