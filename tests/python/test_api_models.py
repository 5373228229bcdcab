"""GET /v1/models and /v1/models/{id}: the one served model, under its configured id."""
import openai
import pytest

from ferry_server import FerryServer, server  # noqa: F401 (fixture)


def test_lists_the_served_model(server):
    models = server.client().models.list().data
    assert [m.id for m in models] == ["glm-5.3-flash"]
    assert models[0].model_extra["max_model_len"] == 4096  # the tiny model's context, below --ctx
    assert models[0].model_extra["synthetic"] is False  # weights from a file (--synthetic: true + its config)


def test_model_id_is_configurable_and_checked(ferry_bin):
    s = FerryServer(ferry_bin, "--model-id", "tiny")
    try:
        assert [m.id for m in s.client().models.list().data] == ["tiny"]
        status, body = s.post("/v1/completions", {"model": "glm-5.3-flash", "prompt": "x", "max_tokens": 1})
        assert status == 404 and "model_not_found" in body and "'tiny'" in body
        status, _ = s.post("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1})
        assert status == 200
    finally:
        assert s.stop() == 0


def test_retrieve_the_served_model(server):
    model = server.client().models.retrieve("glm-5.3-flash")
    assert model.id == "glm-5.3-flash" and model.object == "model"
    assert model.model_extra["max_model_len"] == 4096
    with pytest.raises(openai.NotFoundError) as e:
        server.client().models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"


def test_retrieve_a_model_id_with_a_slash(ferry_bin):
    s = FerryServer(ferry_bin, "--model-id", "zai-org/GLM-5.3-Flash")
    try:
        assert s.client().models.retrieve("zai-org/GLM-5.3-Flash").id == "zai-org/GLM-5.3-Flash"
        status, body = s.get("/v1/models/zai-org%2FGLM-5.3-Flash")
        assert status == 200, body
    finally:
        assert s.stop() == 0
