"""API keys: the bearer scheme in any case (RFC 7235), a WWW-Authenticate challenge on every 401, and
several keys from --api-key-file, each accepted by the real openai client."""
import urllib.error
import urllib.request

import openai
import pytest

from ferry_server import FerryServer


def get_models(server, authorization):
    req = urllib.request.Request(server.base + "/v1/models", headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


@pytest.fixture(scope="module")
def keyed_server(ferry_bin, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# one key per line\nteam-a-key\n\n  team-b-key  \n")
    s = FerryServer(ferry_bin, "--api-key-file", str(keys), api_key="admin-key")
    yield s
    assert s.stop() == 0, s.output()


def test_the_bearer_scheme_is_case_insensitive(keyed_server):
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        status, _ = get_models(keyed_server, f"{scheme} admin-key")
        assert status == 200, scheme


def test_a_401_carries_a_challenge(keyed_server):
    status, headers = get_models(keyed_server, None)
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Bearer realm="ferry"'
    status, headers = get_models(keyed_server, "Bearer wrong-key")
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Bearer realm="ferry", error="invalid_token"'
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=keyed_server.base + "/v1", api_key="wrong", max_retries=0).models.list()
    assert e.value.response.headers["www-authenticate"].startswith("Bearer")


def test_every_key_of_the_file_is_accepted(keyed_server):
    for key in ("admin-key", "team-a-key", "team-b-key"):
        client = openai.OpenAI(base_url=keyed_server.base + "/v1", api_key=key, max_retries=0)
        assert client.models.list().data[0].id == "glm-5.3-flash"
    assert get_models(keyed_server, "Bearer team-c-key")[0] == 401


def test_a_key_file_without_keys_fails_start_up(ferry_bin, tmp_path):
    import subprocess

    empty = tmp_path / "empty.txt"
    empty.write_text("# nobody\n")
    r = subprocess.run([ferry_bin, "serve", "--api-key-file", str(empty)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "--api-key-file" in r.stderr and "no key" in r.stderr
