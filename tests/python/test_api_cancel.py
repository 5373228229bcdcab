"""POST /v1/requests/{id}/cancel: request ids are random (no one can guess or count on the next one),
an unknown id is a 404, a late cancel is the same no-op as a duplicate one, and with several API
keys a request can be cancelled only with the key that made it."""
import json
import re
import time

import openai
import pytest

from ferry_server import FerryServer, server  # noqa: F401 (fixture)


def long_stream(client, prompt):
    stream = client.completions.create(model="glm-5.3-flash", prompt=prompt, max_tokens=3000, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))
    return stream, first.id


def drain(stream):
    events = []
    try:
        for chunk in stream:
            events.append(chunk)
    except openai.APIError as e:  # the error event that ends a cancelled stream
        events.append(e)
    return events


def post(server, path, key=None):
    return server.request("POST", path, headers={"Authorization": f"Bearer {key}"} if key else None)


def test_request_ids_are_random(server):
    client = server.client()
    ids = []
    for i in range(8):
        r = client.completions.create(model="glm-5.3-flash", prompt=[i + 1, 2], max_tokens=1)
        m = re.fullmatch(r"cmpl-(\d+)", r.id)
        assert m, r.id
        ids.append(int(m.group(1)))
    assert len(set(ids)) == len(ids)
    assert all(b - a != 1 for a, b in zip(ids, ids[1:]))  # not a counter
    assert max(ids) > 2**40 and max(ids) < 2**53  # random bits, and exact as a JavaScript number


def test_unknown_ids_are_404_and_late_cancels_are_accepted(server):
    status, body = post(server, "/v1/requests/chatcmpl-12345/cancel")
    assert status == 404
    error = json.loads(body)["error"]
    assert error["code"] == "request_not_found" and error["param"] == "id"
    r = server.client().completions.create(model="glm-5.3-flash", prompt=[3, 4], max_tokens=1)
    time.sleep(0.1)  # the bridge's end reaches the registry
    status, body = post(server, f"/v1/requests/{r.id}/cancel")
    assert status == 202 and json.loads(body)["accepted"] is True  # ended recently: a no-op


@pytest.fixture(scope="module")
def two_key_server(ferry_bin, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("key-alice\nkey-bob\n")
    s = FerryServer(ferry_bin, "--api-key-file", str(keys), "--temperature", "0", api_key="key-operator")
    yield s
    assert s.stop() == 0, s.output()


def test_only_the_key_that_made_a_request_cancels_it(two_key_server):
    s = two_key_server
    alice = openai.OpenAI(base_url=s.base + "/v1", api_key="key-alice", max_retries=0)
    stream, request_id = long_stream(alice, [1, 2, 3])
    status, body = post(s, f"/v1/requests/{request_id}/cancel", key="key-bob")
    assert status == 404, body  # to another key the request does not exist
    status, body = post(s, f"/v1/requests/{request_id}/cancel", key="key-alice")
    assert status == 202, body
    events = drain(stream)
    assert isinstance(events[-1], openai.APIError) and "cancelled" in str(events[-1])
    assert post(s, f"/v1/requests/{request_id}/cancel", key="key-alice")[0] == 202  # late: still a no-op
    assert post(s, f"/v1/requests/{request_id}/cancel", key="key-bob")[0] == 404


def test_with_several_keys_only_the_operator_releases_slots(two_key_server):
    """Releasing a busy slot cancels its request, whoever made it: that is for --api-key alone."""
    s = two_key_server
    status, body = post(s, "/slots/0?action=release", key="key-alice")
    assert status == 403 and json.loads(body)["error"]["type"] == "permission_error"
    assert post(s, "/slots/0?action=release", key="key-operator")[0] == 200
