from tests.app.factories import make_run


def test_health(client, db_backend):
    resp = client.get("/api/health")
    assert resp.status_code == 200
    assert resp.json()["database"] == {"sqlite": "sqlite", "postgres": "postgresql"}[db_backend]


def test_create_and_get_run(client, write_headers):
    run = make_run(client, write_headers, name="first")
    assert run["status"] == "queued" and run["total_steps"] == 3
    got = client.get(f"/api/runs/{run['id']}").json()
    assert got["spec"]["trainer"]["device"] == "cpu"
