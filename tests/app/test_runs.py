"""Runs over the API: create from a saved or inline spec, immutable copies, list filters and
pagination, archive, cancel with and without a launcher, retry with a patch, clone, export."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from tests.app.error_shape import assert_error_shape
from tests.app.factories import RecordingLauncher, engine_headers, make_run, status_event, tiny_spec
from tests.app.pages_support import login, soup


def _events(client, headers, run_id, *events):
    resp = client.post(f"/api/runs/{run_id}/events", json=list(events), headers=engine_headers(client, run_id))
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_create_from_saved_spec_copies_it(client, write_headers):
    spec = client.post("/api/specs", json={"name": "saved", "spec": tiny_spec()}, headers=write_headers).json()
    run = client.post("/api/runs", json={"spec_id": spec["id"]}, headers=write_headers).json()
    assert run["name"] == "saved" and run["spec_id"] == spec["id"] and run["spec"] == spec["spec"]
    assert run["status"] == "queued" and run["progress"] == {"step": 0, "total_steps": 3, "fraction": 0.0}
    assert run["terminal"] is False and run["ray_job"] is None


def test_inline_spec_with_dotted_keys_and_environment(client, write_headers):
    resp = client.post("/api/runs", json={"name": "n", "spec": tiny_spec(), "environment": "cpu"}, headers=write_headers)
    assert resp.status_code == 201
    assert resp.json()["environment"] == "cpu"


def test_list_filters_and_pagination(client, write_headers):
    a = make_run(client, write_headers, name="alpha one")
    b = make_run(client, write_headers, name="beta")
    c = make_run(client, write_headers, name="Alpha two")
    _events(client, write_headers, b["id"], status_event(1, "starting"), status_event(2, "running"))
    client.post(f"/api/runs/{c['id']}/cancel", headers=write_headers)

    def names(**params):
        body = client.get("/api/runs", params=params).json()
        return [r["name"] for r in body["data"]], body["total"]

    assert names() == (["Alpha two", "beta", "alpha one"], 3)
    assert names(name="ALPHA") == (["Alpha two", "alpha one"], 2)
    assert names(status="running") == (["beta"], 1)
    assert names(status=["running", "cancelled"]) == (["Alpha two", "beta"], 2)
    assert names(limit=1, offset=1) == (["beta"], 3)
    assert names(limit=5, offset=10) == ([], 3)
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert names(created_after=future) == ([], 0)
    assert names(created_after=past, created_before=future)[1] == 3
    # bounds in another zone mean the same instant
    in_tokyo = (datetime.now(UTC) - timedelta(hours=1)).astimezone(timezone(timedelta(hours=9)))
    assert names(created_after=in_tokyo.isoformat())[1] == 3
    assert names(created_before=in_tokyo.isoformat())[1] == 0
    assert a["id"] < b["id"] < c["id"]


def test_archive_and_unarchive_over_the_api_as_the_runs_list_does(client, session, write_headers):
    """POST /api/runs/{id}/archive and /unarchive (idempotent), GET /api/runs's ``archived`` filter (hide by
    default, as the runs list page), ``archived`` in a run's JSON; the page's Archive is the same change."""
    kept, put_away = (make_run(client, write_headers, name=name)["id"] for name in ("kept", "put away"))
    assert client.get(f"/api/runs/{put_away}").json()["archived"] is False

    def listed(**params):
        body = client.get("/api/runs", params=params).json()
        return [r["id"] for r in body["data"]], body["total"]

    def on_page(query: str = "") -> list[int]:
        return [int(tr["data-run"]) for tr in soup(client.get("/" + query).text).select("tr[data-run]")]

    for _ in range(2):  # idempotent
        resp = client.post(f"/api/runs/{put_away}/archive", headers=write_headers)
        assert resp.status_code == 200 and resp.json()["id"] == put_away and resp.json()["archived"] is True
    assert client.get(f"/api/runs/{put_away}").json()["archived"] is True
    assert listed() == listed(archived="hide") == ([kept], 1) and on_page() == [kept]
    assert listed(archived="with") == ([put_away, kept], 2) and on_page("?archived=with") == [put_away, kept]
    assert listed(archived="only") == ([put_away], 1) and on_page("?archived=only") == [put_away]
    assert [r["archived"] for r in client.get("/api/runs", params={"archived": "with"}).json()["data"]] == [True, False]
    # with another filter (a statement built per request, not the prebuilt pages)
    assert listed(name="put") == ([], 0)
    assert listed(name="put", archived="only") == ([put_away], 1)
    assert listed(name="put", archived="with", limit=1) == ([put_away], 1)
    for _ in range(2):
        resp = client.post(f"/api/runs/{put_away}/unarchive", headers=write_headers)
        assert resp.status_code == 200 and resp.json()["archived"] is False
    assert listed() == ([put_away, kept], 2)
    # the page's Archive button changes what the API answers, and the API's what the page shows
    csrf = login(client, session, ["read", "write"])
    assert client.post(f"/runs/{kept}/archive", data={"csrf_token": csrf}, follow_redirects=False).status_code == 303
    assert listed(archived="only") == ([kept], 1)
    client.post(f"/api/runs/{kept}/unarchive", headers=write_headers)
    assert on_page() == [put_away, kept]


def test_archive_over_the_api_refuses_what_it_cannot_do(client, write_headers, read_headers):
    run_id = make_run(client, write_headers)["id"]
    for action in ("archive", "unarchive"):
        resp = client.post(f"/api/runs/987654/{action}", headers=write_headers)
        assert resp.status_code == 404, resp.text
        assert_error_shape(404, resp.json())
        assert resp.json()["error"]["value"] == 987654 and "987654" in resp.json()["error"]["message"]
        assert client.post(f"/api/runs/{run_id}/{action}", headers=read_headers).status_code == 403
        assert client.post(f"/api/runs/{run_id}/{action}").status_code == 401
    resp = client.get("/api/runs", params={"archived": "yes"})
    assert resp.status_code == 422
    assert_error_shape(422, resp.json())
    error = resp.json()["error"]
    assert (error["field"], error["value"]) == ("archived", "yes") and "only" in str(error["valid"]), error
    assert client.get(f"/api/runs/{run_id}").json()["archived"] is False


def test_list_by_spec_id(client, write_headers):
    spec = client.post("/api/specs", json={"name": "s", "spec": tiny_spec()}, headers=write_headers).json()
    mine = client.post("/api/runs", json={"spec_id": spec["id"]}, headers=write_headers).json()
    make_run(client, write_headers, name="other")
    body = client.get("/api/runs", params={"spec_id": spec["id"]}).json()
    assert [r["id"] for r in body["data"]] == [mine["id"]]


def test_cancel_queued_is_immediate(client, write_headers):
    run = make_run(client, write_headers)
    body = client.post(f"/api/runs/{run['id']}/cancel", headers=write_headers).json()
    assert body["status"] == "cancelled" and body["finished_at"] and body["terminal"]
    again = client.post(f"/api/runs/{run['id']}/cancel", headers=write_headers)
    assert again.status_code == 409
    assert again.json()["error"]["message"] == (f"run {run['id']} is already cancelled: only queued, starting or "
                                                "running runs can be cancelled")


def test_cancel_running_without_launcher_is_immediate(client, write_headers):
    run = make_run(client, write_headers)
    _events(client, write_headers, run["id"], status_event(1, "starting"), status_event(2, "running"))
    body = client.post(f"/api/runs/{run['id']}/cancel", headers=write_headers).json()
    assert body["status"] == "cancelled" and body["status_reason"] == "cancelled (no launcher attached)"


def test_cancel_running_with_launcher_waits_for_the_worker(client, api, write_headers):
    launcher = RecordingLauncher()
    api.state.launcher = launcher
    run = make_run(client, write_headers)
    assert launcher.submitted == [run["id"]] and run["ray_job"] == f"job-{run['id']}"
    _events(client, write_headers, run["id"], status_event(1, "starting"), status_event(2, "running"))
    body = client.post(f"/api/runs/{run['id']}/cancel", headers=write_headers).json()
    assert (body["status"], body["cancel_requested"]) == ("running", True)
    assert launcher.cancelled == [run["id"]]
    _events(client, write_headers, run["id"], status_event(3, "cancelled", "stopped by user"))
    done = client.get(f"/api/runs/{run['id']}").json()
    assert (done["status"], done["cancel_requested"], done["status_reason"]) == ("cancelled", False, "stopped by user")


def test_cancel_ends_a_run_in_every_non_terminal_state(client, api, write_headers):
    """A run that shows starting or running without a job (never handed to compute) cannot wait for workers to
    stop: cancel ends it at once, even with a launcher attached."""
    for shown in ("starting", "running"):
        api.state.launcher = RecordingLauncher(fail=True)
        run_id = client.post("/api/runs", json={"name": "x", "spec": tiny_spec()}, headers=write_headers).json()["error"]["value"]
        events = [status_event(1, "starting")] + ([status_event(2, "running")] if shown == "running" else [])
        _events(client, write_headers, run_id, *events)
        api.state.launcher = RecordingLauncher()
        body = client.post(f"/api/runs/{run_id}/cancel", headers=write_headers).json()
        assert (body["status"], body["status_reason"]) == ("cancelled", "cancelled (no job was started for it)"), shown


def test_unreachable_launcher_keeps_the_run_queued(client, api, write_headers):
    api.state.launcher = RecordingLauncher(fail=True)
    resp = client.post("/api/runs", json={"name": "later", "spec": tiny_spec()}, headers=write_headers)
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "launcher_unavailable" and "not reachable" in error["message"]
    kept = client.get(f"/api/runs/{error['value']}").json()
    assert kept["status"] == "queued" and kept["status_reason"].startswith("not submitted yet")


def test_retry_with_patch_revalidates_and_links(client, write_headers):
    run = make_run(client, write_headers, name="first")
    patch = {"critic.model.override_config.attn_implementation": "eager", "attnboard.seed": 1}
    resp = client.post(f"/api/runs/{run['id']}/retry", json={"patch": patch}, headers=write_headers)
    assert resp.status_code == 201, resp.text
    retry = resp.json()
    assert retry["retry_of"] == run["id"] and retry["name"] == "first (retry)" and retry["status"] == "queued"
    assert retry["spec"]["critic"]["model"]["override_config"] == {"attn_implementation": "eager"}
    assert retry["spec"]["attnboard"]["seed"] == 1
    # the original keeps its own copy
    assert client.get(f"/api/runs/{run['id']}").json()["spec"] == run["spec"]
    unknown = client.post(f"/api/runs/{run['id']}/retry", json={"patch": {"trainer.n_gpu_per_node": 2}},
                          headers=write_headers).json()["error"]
    assert unknown["field"] == "spec.trainer.n_gpu_per_node" and unknown["valid"] == "trainer.n_gpus_per_node"


def test_retry_without_body_and_removing_a_key(client, write_headers):
    run = make_run(client, write_headers, **{"actor_rollout_ref.model.override_config.attn_implementation": "sdpa"})
    plain = client.post(f"/api/runs/{run['id']}/retry", headers=write_headers).json()
    assert plain["spec"] == run["spec"]
    removed = client.post(f"/api/runs/{run['id']}/retry",
                          json={"patch": {"actor_rollout_ref.model.override_config.attn_implementation": None}},
                          headers=write_headers).json()
    assert removed["spec"]["actor_rollout_ref"]["model"]["override_config"] == {}


def test_clone_is_independent(client, write_headers):
    run = make_run(client, write_headers, name="x" * 200)
    clone = client.post(f"/api/runs/{run['id']}/clone", headers=write_headers).json()
    assert clone["retry_of"] is None and clone["spec"] == run["spec"] and clone["id"] != run["id"]
    assert clone["name"].endswith(" (copy)") and len(clone["name"]) == 200
    named = client.post(f"/api/runs/{run['id']}/clone", json={"name": "mine"}, headers=write_headers).json()
    assert named["name"] == "mine"


@pytest.mark.parametrize("fmt", ["cli", "yaml"])
def test_run_export(client, write_headers, fmt):
    run = make_run(client, write_headers)
    body = client.get(f"/api/runs/{run['id']}/export", params={"format": fmt}).json()
    assert body["format"] == fmt and "builtin:tiny-llama" in body["text"]


@pytest.mark.parametrize("key,value", [
    ("data.train_files", "/etc/shadow"),
    ("data.train_files", "/proc/self/environ"),
    ("data.train_files", "../../../../etc/passwd"),
    ("actor_rollout_ref.model.path", "/etc"),
    ("trainer.default_local_dir", "../7/checkpoints"),
    ("trainer.default_local_dir", "/tmp/anywhere"),
])
def test_paths_outside_the_allowed_folders_are_refused_at_submit(client, write_headers, key, value):
    """POST /api/runs and /api/resolve name the key; nothing is stored; a missing and an existing file outside
    the roots read the same (no existence oracle)."""
    before = client.get("/api/runs").json()["total"]
    resp = client.post("/api/runs", json={"spec": tiny_spec(**{key: value})}, headers=write_headers)
    assert resp.status_code == 422 and resp.json()["error"]["field"] == f"spec.{key}", resp.text
    assert client.get("/api/runs").json()["total"] == before
    resolved = client.post("/api/resolve", json={"spec": tiny_spec(**{key: value})}, headers=write_headers).json()
    assert f"spec.{key}" in [i["field"] for i in resolved["issues"] if i["severity"] == "error"]


def test_no_existence_oracle_at_submit(client, write_headers, tmp_path):
    present = tmp_path / "train.parquet"
    present.write_bytes(b"PAR1 not for you")
    answers = []
    for path in (present, tmp_path / "absent.parquet"):
        error = client.post("/api/runs", json={"spec": tiny_spec(**{"data.train_files": str(path)})},
                            headers=write_headers).json()["error"]
        answers.append(json.dumps(error).replace(str(path), "PATH"))
        assert "not for you" not in answers[-1]
    assert answers[0] == answers[1]


def test_a_data_file_inside_the_data_roots_is_accepted(make_client, session, tmp_path):
    from tests.conftest import _token_headers

    (tmp_path / "files").mkdir()
    client = make_client(DATA_ROOTS=str(tmp_path / "files"))
    headers = _token_headers(session, ["read", "write"])
    inside_spec = tiny_spec(**{"data.train_files": str(tmp_path / "files" / "t.parquet")})
    inside = client.post("/api/runs", json={"spec": inside_spec}, headers=headers)
    assert inside.status_code == 201, inside.text
    outside = client.post("/api/runs", json={"spec": tiny_spec(**{"data.train_files": str(tmp_path / "t.parquet")})},
                          headers=headers)
    assert outside.status_code == 422 and outside.json()["error"]["valid"].endswith(f"({tmp_path / 'files'})")
