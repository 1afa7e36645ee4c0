"""Auth: the token guards every change and, when set, every page; a non-loopback bind needs it."""

import pytest

from gpuwhy.app.service import Service, check_bind_address
from gpuwhy.config import load_config
from gpuwhy.errors import ConfigError
from gpuwhy.store import open_store
from gpuwhy.store.overrides import read_overrides
from gpuwhy.webui import create_app

from .conftest import TOKEN, build

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fresh(tmp_path):
    """Its own store: these tests change rule overrides."""
    return build(tmp_path)


def a_rule_with_params(client, headers=BEARER):
    return next(r for r in client.get("/api/rules", headers=headers).get_json() if r["params"])


def overrides(scenario):
    db = open_store(scenario.path, readonly=True)
    try:
        return read_overrides(db)
    finally:
        db.close()


def test_without_a_configured_token_changes_are_refused(fresh):
    app = create_app(fresh.config.replace({"web.auth_token": ""}))
    client = app.test_client()
    assert client.get("/rules").status_code == 200          # reading needs nothing then
    rule = a_rule_with_params(client, {})
    response = client.post(f"/rules/{rule['id']}", data={"enabled": "false", "token": ""})
    assert response.status_code == 403 and b"GPUWHY_AUTH_TOKEN" in response.data
    api = client.post(f"/api/rules/{rule['id']}", json={"enabled": False},
                      headers={"Authorization": "Bearer anything"})
    assert api.status_code == 403
    assert overrides(fresh) == {}


def test_changes_need_the_token_in_the_request(fresh):
    client = create_app(fresh.config).test_client()
    rule = a_rule_with_params(client)
    assert client.post(f"/rules/{rule['id']}", data={"enabled": "false"},
                       headers={}).status_code in (302, 401)     # not even logged in
    client.post("/login", data={"token": TOKEN})               # a session cookie ...
    refused = client.post(f"/rules/{rule['id']}", data={"enabled": "false"})
    assert refused.status_code == 401                          # ... is not enough to change
    wrong = client.post(f"/rules/{rule['id']}", data={"enabled": "false", "token": "nope"})
    assert wrong.status_code == 401
    assert client.post(f"/api/rules/{rule['id']}", json={"enabled": False},
                       headers={"Authorization": "Bearer nope"}).status_code == 401
    assert overrides(fresh) == {}


def test_the_form_and_the_api_change_rules_like_gpuwhy_rules_set(fresh):
    client = create_app(fresh.config).test_client()
    rule = a_rule_with_params(client)
    name = next(iter(rule["params"]))
    response = client.post(f"/rules/{rule['id']}", headers=BEARER, data={
        "enabled": "false", "shadow": "", f"threshold.{name}": "0.42", "token": TOKEN})
    assert response.status_code == 303 and f"changed={rule['id']}" in response.location
    stored = overrides(fresh)[rule["id"]]
    assert stored.enabled is False and stored.params == {name: 0.42}
    listed = next(r for r in client.get("/api/rules", headers=BEARER).get_json()
                  if r["id"] == rule["id"])
    assert listed["enabled"] is False and listed["params"][name] == 0.42
    api = client.post(f"/api/rules/{rule['id']}", headers=BEARER,
                      json={"enabled": True, "shadow": True})
    assert api.get_json() == {"id": rule["id"], "enabled": True, "shadow": True,
                              "params": {name: 0.42}}
    bad = client.post(f"/api/rules/{rule['id']}", headers=BEARER,
                      json={"thresholds": {"no_such_threshold": 1}})
    assert bad.status_code == 400 and "no threshold" in bad.get_json()["error"]
    assert client.post("/api/rules/NO_SUCH_RULE", headers=BEARER,
                       json={"enabled": False}).status_code == 404


def test_with_a_token_every_page_asks_for_it(scenario):
    client = create_app(scenario.config).test_client()
    assert client.get("/healthz").status_code == 200            # liveness stays open
    assert client.get("/api/gpus").status_code == 401
    assert client.get("/metrics").status_code == 401
    redirect = client.get("/incidents")
    assert redirect.status_code == 302 and "/login?next=" in redirect.location
    assert client.post("/login", data={"token": "wrong"}).status_code == 401
    logged = client.post("/login?next=/incidents", data={"token": TOKEN})
    assert logged.status_code == 302 and logged.location.endswith("/incidents")
    assert client.get("/incidents").status_code == 200
    assert client.get("/api/gpus").status_code == 200


def test_login_never_redirects_off_site(scenario):
    client = create_app(scenario.config).test_client()
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        response = client.post(f"/login?next={target}", data={"token": TOKEN})
        assert response.status_code == 302 and response.location == "/", target


def test_auth_on_without_a_token_refuses_to_start(tmp_path):
    config = load_config(environ={"GPUWHY_DB": str(tmp_path / "x.db"), "ENABLE_AUTH": "1"})
    with pytest.raises(ConfigError, match="GPUWHY_AUTH_TOKEN"):
        create_app(config)


def test_non_local_bind_without_auth_refuses_to_start(tmp_config):
    with pytest.raises(ConfigError, match="without authentication"):
        Service(tmp_config.replace({"web.host": "0.0.0.0"}), with_probes=False, sources={})
    with pytest.raises(ConfigError):
        check_bind_address("10.1.2.3")
    check_bind_address("127.0.0.1")
    check_bind_address("::1")
    check_bind_address("0.0.0.0", auth_token=TOKEN)


def test_non_local_bind_with_a_token_starts_and_asks_for_it(tmp_config):
    import json
    import urllib.error
    import urllib.request

    config = tmp_config.replace({"web.host": "0.0.0.0", "web.port": 0,
                                 "web.auth_token": TOKEN})
    service = Service(config, with_probes=False, sources={})
    try:
        service.start()
        url = f"http://127.0.0.1:{service.web.server_port}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/gpus", timeout=5)
        assert refused.value.code == 401
        request = urllib.request.Request(f"{url}/api/gpus", headers=BEARER)
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response) == []
    finally:
        service.stop()
