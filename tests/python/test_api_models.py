"""GET /v1/models: the one served model, under its configured id."""
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
