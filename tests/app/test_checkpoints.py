"""A run's checkpoints in the API and on its page, and "resume from checkpoint" for a failed or cancelled run
(no Ray: the folders are laid out as the engine lays them out, under the app's checkpoint root)."""

from __future__ import annotations

import json
import shutil

import pytest

from app.services.checkpoints import run_folder
from tests.app.factories import engine_headers, make_run, status_event
from tests.app.pages_support import csrf_of, login, soup
from tests.utils.checkpoints import write_checkpoint
from worker.engine import checkpoint


@pytest.fixture
def root(settings):
    """The app's checkpoint root, emptied after the test (run ids start again at 1 in the next one)."""
    yield settings.checkpoint_root
    shutil.rmtree(settings.checkpoint_root, ignore_errors=True)


def _ended(client, headers, run_id: int, status: str = "failed") -> None:
    events = [status_event(1, "starting"), status_event(2, "running"), status_event(3, status, "rank 1 died")]
    assert client.post(f"/api/runs/{run_id}/events", json=events, headers=engine_headers(client, run_id)).status_code == 200


def _folder(client, run_id: int, root):
    from app.models import Run

    run = Run(id=run_id, name="x", spec=client.get(f"/api/runs/{run_id}").json()["spec"])
    return run_folder(run, root)


def test_checkpoints_are_listed_from_the_runs_folder(client, write_headers, read_headers, root):
    run = make_run(client, write_headers, "ckpt", **{"trainer.save_freq": 2})
    folder = _folder(client, run["id"], root)
    assert folder == root / str(run["id"]) / "checkpoints" / "verl_examples" / "gsm8k"
    write_checkpoint(folder, 2, run_id=str(run["id"]))
    write_checkpoint(folder, 4, run_id=str(run["id"]), roles=("critic",))
    checkpoint.partial_folder(folder, 6, str(run["id"])).mkdir()
    listed = client.get(f"/api/runs/{run['id']}/checkpoints", headers=read_headers).json()
    assert listed["folder"] == str(folder)
    assert [(c["step"], c["roles"], c["resumable"], c["saved_at"]) for c in listed["data"]] == [
        (2, ["actor", "critic"], True, "2026-12-04T10:00:00+00:00"), (4, ["critic"], False, "2026-12-04T10:00:00+00:00")]
    assert listed["data"][0]["size_bytes"] == checkpoint.folder_size(folder / "global_step_2")
    assert listed["data"][0]["path"] == str(folder / "global_step_2")
    assert listed["skipped"] == [{"path": str(folder / f"global_step_6.partial-{run['id']}"),
                                  "why": "an unfinished write (no rename to its final name): interrupted"}]
    assert client.get("/api/runs/999999/checkpoints").status_code == 404
    # anonymous readers get the same listing with paths relative to the checkpoint root (no absolute folders)
    anonymous = client.get(f"/api/runs/{run['id']}/checkpoints").json()
    assert anonymous["folder"] == str(folder.relative_to(root))
    assert anonymous["data"][0]["path"] == str((folder / "global_step_2").relative_to(root))
    assert str(root) not in json.dumps(anonymous)


def test_resume_makes_a_new_run_from_the_newest_resumable_checkpoint(client, write_headers, read_headers, root):
    run = make_run(client, write_headers, "long", **{"trainer.save_freq": 2, "trainer.total_training_steps": 6})
    folder = _folder(client, run["id"], root)
    write_checkpoint(folder, 2)
    write_checkpoint(folder, 4, roles=("critic",))  # pruned actor: not resumable
    refused = client.post(f"/api/runs/{run['id']}/resume", headers=write_headers)
    assert refused.status_code == 409
    assert refused.json()["error"]["field"] == "status" and refused.json()["error"]["valid"] == ["failed", "cancelled"]
    _ended(client, write_headers, run["id"])
    resp = client.post(f"/api/runs/{run['id']}/resume", json={"patch": {"trainer.total_training_steps": 8}},
                       headers=write_headers)
    assert resp.status_code == 201, resp.text
    new = resp.json()
    assert new["retry_of"] == run["id"] and new["name"] == "long (resumed)" and new["status"] == "queued"
    trainer = new["spec"]["trainer"]
    assert (trainer["resume_mode"], trainer["resume_from_path"], trainer["total_training_steps"]) == \
        ("resume_path", str(folder / "global_step_2"), 8)
    assert client.post(f"/api/runs/{run['id']}/resume", headers=read_headers).status_code == 403


def test_resume_without_a_checkpoint_says_why(client, write_headers, root):
    run = make_run(client, write_headers, "none")
    _ended(client, write_headers, run["id"], "cancelled")
    resp = client.post(f"/api/runs/{run['id']}/resume", headers=write_headers)
    assert resp.status_code == 409
    error = resp.json()["error"]
    assert error["field"] == "trainer.save_freq" and error["value"] == -1
    assert error["message"] == (f"run {run['id']} has no complete checkpoint in {_folder(client, run['id'], root)}: "
                                f"it saves none (trainer.save_freq is -1); retry it instead, or resume a run that "
                                f"saved one")


def test_the_run_page_lists_checkpoints_and_offers_resume_when_the_run_ended(client, session, write_headers, root):
    csrf = login(client, session, ["read", "write"])
    run = make_run(client, write_headers, "page", **{"trainer.save_freq": 2})
    folder = _folder(client, run["id"], root)
    write_checkpoint(folder, 2)
    write_checkpoint(folder, 4)
    page = soup(client.get(f"/runs/{run['id']}").text)
    assert [tr["data-step"] for tr in page.select("#checkpoints tr[data-step]")] == ["4", "2"]
    assert page.select_one("#checkpoints time")["datetime"] == "2026-12-04T10:00:00+00:00"
    assert page.select_one("form[action$='/resume']") is None  # still queued: nothing to resume
    _ended(client, write_headers, run["id"])
    html = client.get(f"/runs/{run['id']}").text
    button = soup(html).select_one(f"form[action='/runs/{run['id']}/resume'] button")
    assert button is not None and button.text.strip() == "Resume from checkpoint (step 4)"
    resp = client.post(f"/runs/{run['id']}/resume", data={"csrf_token": csrf_of(html)}, follow_redirects=False)
    assert resp.status_code == 303
    new_id = int(resp.headers["location"].rsplit("/", 1)[-1])
    assert client.get(f"/api/runs/{new_id}").json()["spec"]["trainer"]["resume_from_path"] == str(folder / "global_step_4")
    assert csrf  # logged in with the write scope


def test_the_run_page_shows_the_restart_and_where_the_restarted_ranks_ran(client, session, root):
    from tests.app.pages_support import engine_events, stored_run

    first = engine_events("succeeded")[:-3]
    attention = next(p for kind, p in first if kind == "attention" and p["role"] == "critic" and p["rank"] == 1)
    restart = {"message": "restart 1 of 2: rank 1 died: killed; resuming from step 2 (/c/global_step_2)",
               "cause": "rank 1 died: killed", "rank": 1, "attempt": 1, "max_restarts": 2, "resumed_from_step": 2,
               "checkpoint": "/c/global_step_2", "source": "engine"}
    moved = {**attention, "node": "10.0.0.9", "pid": 4242, "attempt": 1, "effective": "eager", "observed": "eager"}
    run_id = stored_run(session, events=[*first, ("restart", restart), ("attention", moved)])
    login(client, session, ["read"])
    page = soup(client.get(f"/runs/{run_id}").text)
    assert page.select_one("#status .restarts").text.strip() == f"Restarted 1 time: {restart['message']}"
    assert page.select_one("#trouble li.kind-restart .message").text.strip() == restart["message"]
    row = page.select_one("tr[data-role='critic'][data-rank='1'] td.node")
    assert row.select_one("code").text == "10.0.0.9" and "pid 4242" in row.text and "after restart 1" in row.text
    assert row.select_one(".before.warning-inline").text.split() == ["before:", "sdpa", "on", attention["node"]]


def test_the_stream_sends_the_restart_the_checkpoints_and_the_resume_offer(client, session, root):
    from app.models import Run
    from tests.app.pages_support import engine_events, parse_sse, stored_run

    events = engine_events("succeeded")
    restart = {"message": "restart 1 of 2: rank 0 died; resuming from step 2", "cause": "rank 0 died", "rank": 0,
               "attempt": 1, "max_restarts": 2, "resumed_from_step": 2, "checkpoint": None, "source": "engine"}
    saved = {"message": "checkpoint saved: step 2", "checkpoint": {"step": 2, "path": "/x", "size_bytes": 1}}
    failed = {"state": "failed", "status": "failed", "reason": "rank 0 died (after 2 restarts)"}
    run_id = stored_run(session, events=[*events[:-1], ("log", saved), ("restart", restart), ("status", failed)])
    write_checkpoint(run_folder(session.get(Run, run_id), root), 2)
    messages = parse_sse(client.get(f"/runs/{run_id}/stream").text)
    names = [m["event"] for m in messages]
    assert names.count("checkpoints") == 3  # the save, the restart and the end
    trouble = next(m for m in messages if m["event"] == "trouble" and "restart 1 of 2" in m["data"])
    assert int(trouble["id"]) == len(events) + 1
    actions = [m for m in messages if m["event"] == "actions"][-1]
    assert "Resume from checkpoint (step 2)" in actions["data"]
