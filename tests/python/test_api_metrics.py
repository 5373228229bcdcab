"""GET /metrics: Prometheus text whose counters move with the traffic."""
import re

from ferry_server import chat_messages, server  # noqa: F401 (fixture)


def parse(text):
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)", line)
        assert m, f"not a Prometheus sample line: {line!r}"
        samples[m.group(1)] = float(m.group(2))
    return samples


def test_counters_follow_requests(server):
    status, before_text = server.get("/metrics")
    assert status == 200
    before = parse(before_text)
    server.client().chat.completions.create(model="glm-5.3-flash", messages=chat_messages(), max_tokens=4,
                                            extra_body={"ignore_eos": True})
    after = parse(server.get("/metrics")[1])
    assert after["ferry_generation_tokens_total"] - before["ferry_generation_tokens_total"] == 4
    assert after['ferry_requests_finished_total{status="finished_length"}'] >= 1
    key = 'ferry_http_requests_total{endpoint="chat_completions",code="200"}'
    assert after[key] - before.get(key, 0) == 1
    assert after["ferry_time_to_first_token_seconds_count"] > before.get("ferry_time_to_first_token_seconds_count", 0)
    assert after['ferry_slots{state="idle"}'] == 3
    assert after["ferry_queue_length"] == 0
    assert after["ferry_up"] == 1
    assert after['ferry_step_seconds_bucket{le="+Inf"}'] == after["ferry_step_seconds_count"]


def test_metric_names_follow_prometheus_conventions(server):
    """What `promtool check metrics` checks of names: counters end in _total and nothing else does."""
    text = server.get("/metrics")[1]
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))
    assert types["ferry_model_size_bytes"] == "gauge"
    for name, kind in types.items():
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
