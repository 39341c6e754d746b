"""Attention trials over the API and the pages: validation, a real CPU trial in the background (eager vs
sdpa on the tiny model, through Ray), stored results compared side by side, the new-run form's button."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from app.deps import get_trial_starter
from app.models_troubleshooting import Trial, TrialCreate, TrialStatus
from app.services import trials as trials_service
from app.services.ray_runtime import HEAD_RECORD, HeadRecord, pid_alive, stop_head
from tests.app.factories import tiny_spec
from tests.app.pages_support import csrf_of, login, soup
from tests.app.service_support import AppProcess, app_env, ray_env, ray_query, token_headers
from worker.core.environment import PROFILES
from worker.engine.trial import Column, StepFigures, TrialResult, recommend

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TRIAL_SPEC = tiny_spec(**{"data.max_response_length": 8})


def stored_trial(session: Session, *, name: str, times: dict[str, float]) -> Trial:
    """A finished trial stored through the service, its result built from figures (no engine)."""
    trial = trials_service.create_trial(session, data=TrialCreate(name=name, spec=TRIAL_SPEC,
                                                                  implementations=list(times), steps=2), author="t")
    columns = [Column(impl, "ok", steps=[StepFigures(1, 100 / t, t, 400.0), StepFigures(2, 100 / t, t, 410.0)],
                      tokens_per_s=100 / t, step_time_s=t, step_time_spread=0.0, peak_memory_mb=410.0,
                      parity_max_abs_diff=0.0 if impl == "eager" else 2e-7, parity_ok=True) for impl, t in times.items()]
    result = TrialResult(columns=columns, recommendation=recommend(columns), steps=2, environment=PROFILES["cpu"].to_dict())
    trial.result, trial.status = result.as_dict(), TrialStatus.succeeded.value
    session.add(trial)
    session.commit()
    return trial


@pytest.mark.parametrize("body,field,words", [
    ({"spec": TRIAL_SPEC, "implementations": ["sdpa", "flash"]}, "implementations[1]", "'flash' is not an attention"),
    ({"spec": TRIAL_SPEC, "implementations": []}, "implementations", ""),
    ({"spec": TRIAL_SPEC, "steps": 0}, "steps", ""),
    ({"spec": TRIAL_SPEC, "steps": 21}, "steps", ""),
    ({"spec": {**TRIAL_SPEC, "trainer.device": "tpu"}}, "spec.trainer.device", ""),
    ({"spec": TRIAL_SPEC, "environment": "cuda-sm99"}, "environment", "unknown environment profile"),
    ({"spec": TRIAL_SPEC, "environment": {"device": "cpu", "colour": "red"}}, "environment.colour", "unknown field"),
    ({"spec": TRIAL_SPEC, "speed": "fast"}, "speed", "unknown key"),
])
def test_bad_trials_name_the_field(client, write_headers, body, field, words):
    resp = client.post("/api/trials", json=body, headers=write_headers)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["field"] == field
    assert words in error["message"]
    assert client.get("/api/trials").json()["total"] == 0  # nothing stored, nothing started


def test_trials_need_a_write_token(client, read_headers):
    assert client.post("/api/trials", json={"spec": TRIAL_SPEC}).status_code == 401
    assert client.post("/api/trials", json={"spec": TRIAL_SPEC}, headers=read_headers).status_code == 403


def test_stored_trials_are_listed_and_compared_side_by_side(client, session):
    first = stored_trial(session, name="before", times={"sdpa": 0.5, "eager": 1.0})
    second = stored_trial(session, name="after", times={"sdpa": 0.8, "eager": 0.4})
    listed = client.get("/api/trials").json()
    assert [t["id"] for t in listed["data"]] == [second.id, first.id]
    compared = client.get("/api/trials", params={"ids": f"{first.id},{second.id}"}).json()["data"]
    assert [(t["name"], t["result"]["recommendation"]["implementation"]) for t in compared] == [
        ("before", "sdpa"), ("after", "eager")]
    assert client.get("/api/trials/999999").json()["error"]["field"] == "trial_id"

    page = soup(client.get(f"/trials?ids={first.id}&ids={second.id}").text)
    tables = page.select("table.trial-columns")
    assert [t["data-trial"] for t in tables] == [str(first.id), str(second.id)]
    assert [th["data-impl"] for th in tables[0].select("thead th[data-impl]")] == ["sdpa", "eager"]
    assert [td.get_text(strip=True) for td in tables[0].select("td.tokens-per-s")] == ["200", "100"]
    assert [p["data-recommended"] for p in page.select("p.recommendation")] == ["sdpa", "eager"]
    listing = soup(client.get("/trials").text)
    assert [tr["data-trial"] for tr in listing.select("tr[data-trial]")] == [str(second.id), str(first.id)]


def test_trial_page_refreshes_itself_until_the_trial_ends(client, session):
    done = stored_trial(session, name="done", times={"eager": 1.0})
    queued = trials_service.create_trial(session, data=TrialCreate(spec=TRIAL_SPEC), author="t")
    running = soup(client.get(f"/trials/{queued.id}").text).select_one("#result")
    assert running["data-status"] == "queued" and running["hx-trigger"] == "every 2s"
    finished = soup(client.get(f"/trials/{done.id}", headers={"HX-Request": "true"}).text).select_one("#result")
    assert finished["data-status"] == "succeeded" and finished.get("hx-trigger") is None


def test_the_run_form_starts_a_trial(api, client, session):
    started: list[int] = []
    api.dependency_overrides[get_trial_starter] = lambda: started.append  # record the start, run nothing
    csrf = login(client, session, ["read", "write"])
    form = soup(client.get("/runs/new").text)
    button = form.select_one("#run-form button#run-trial")
    assert button["formaction"] == "/trials/from-form"
    data: dict[str, Any] = {el["name"]: el.get("value", "") for el in form.select("#run-form input[name]")
                            if el.get("type") != "checkbox"}
    data.update({sel["name"]: (sel.select_one("option[selected]") or sel.select_one("option"))["value"]
                 for sel in form.select("#run-form select[name]")})
    data.update({"csrf_token": csrf, "trial_steps": "2", "name": "form trial"})
    ticked = [el["value"] for el in form.select("#run-form input[name='trial_implementations'][checked]")]
    resp = client.post("/trials/from-form", data={**data, "trial_implementations": ticked}, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    trial = client.get(f"/api/trials/{started[0]}").json()
    assert resp.headers["location"] == f"/trials/{trial['id']}"
    assert (trial["name"], trial["steps"], trial["status"]) == ("trial: form trial", 2, "queued")
    assert trial["implementations"] == ["flash_attention_2", "sdpa", "eager"]
    bad = client.post("/trials/from-form", data={**data, "trial_steps": "0"}, follow_redirects=False)
    assert bad.status_code == 422
    none = client.post("/trials/from-form", data=data, follow_redirects=False)  # every implementation unticked
    assert none.status_code == 422 and "trial_implementations: none ticked" in none.text
    two = client.post("/trials/from-form", data={**data, "trial_implementations": ["sdpa", "eager"]},
                      follow_redirects=False)
    assert two.status_code == 303 and client.get(f"/api/trials/{started[-1]}").json()["implementations"] == ["sdpa",
                                                                                                           "eager"]
    assert csrf_of(client.get(f"/trials/{trial['id']}").text) == csrf


# --------------------------------------------------------------------------------------------
# A real trial through the API


def test_a_queued_trial_is_cancelled_at_once_and_an_ended_one_cannot_be(client, write_headers):
    trial = client.post("/api/trials", json={"spec": TRIAL_SPEC, "implementations": ["eager"]}, headers=write_headers)
    assert trial.status_code == 202 and trial.json()["status_reason"] == trials_service.QUEUED
    trial_id = trial.json()["id"]
    resp = client.post(f"/api/trials/{trial_id}/cancel", headers=write_headers)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["status"], body["status_reason"], body["cancel_requested"]) == ("cancelled", "cancelled before it "
                                                                                 "started", True)
    again = client.post(f"/api/trials/{trial_id}/cancel", headers=write_headers)
    assert again.status_code == 409
    error = again.json()["error"]
    assert (error["field"], error["value"]) == ("status", "cancelled") and "only queued or running" in error["message"]
    assert client.post("/api/trials/999999/cancel", headers=write_headers).status_code == 404


def test_the_trial_page_says_what_it_waits_for_and_cancels(client, session):
    csrf = login(client, session, ["read", "write"])
    trial = trials_service.create_trial(session, data=TrialCreate(spec=TRIAL_SPEC), author="t")
    trial.status_reason = "waiting for 2 CPU (0 free of 2)"
    session.add(trial)
    session.commit()
    page = soup(client.get(f"/trials/{trial.id}").text)
    assert page.select_one(".trial-status-reason").text == "waiting for 2 CPU (0 free of 2)"
    form = page.select_one(f"form[action='/trials/{trial.id}/cancel']")
    assert form.select_one("#cancel-trial") is not None
    listed = soup(client.get("/trials").text).select_one(f"tr[data-trial='{trial.id}'] .status-reason")
    assert listed.text == "waiting for 2 CPU (0 free of 2)"
    resp = client.post(f"/trials/{trial.id}/cancel", data={"csrf_token": csrf}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == f"/trials/{trial.id}"
    after = soup(client.get(f"/trials/{trial.id}").text)
    assert after.select_one("#result")["data-status"] == "cancelled" and after.select_one("#cancel-trial") is None


def _progress(state: str, reason: str, **extra: Any) -> dict[str, Any]:
    return {"state": state, "reason": reason, "result": None, "error": None, "terminal": state in
            ("succeeded", "failed", "cancelled"), **extra}


@pytest.mark.parametrize("steps,expected", [
    ([_progress("queued", "submitted to the engine host")], ("queued", "submitted to the engine host", False, False)),
    ([_progress("running", "measuring sdpa (1 of 2, 2 steps)")], ("running", "measuring sdpa (1 of 2, 2 steps)", True,
                                                                   False)),
    ([_progress("running", "x"), _progress("failed", "no implementation completed the trial (sdpa failed: boom)",
                                           error="no implementation completed the trial (sdpa failed: boom)")],
     ("failed", "no implementation completed the trial (sdpa failed: boom)", True, True)),
    ([_progress("cancelled", "cancelled by the user")], ("cancelled", "cancelled by the user", True, True)),
])
def test_a_jobs_progress_is_written_into_the_trial_row(steps, expected):
    trial = Trial(name="t", spec=TRIAL_SPEC, implementations=["sdpa", "eager"], steps=2, author="t")
    for progress in steps:
        assert trials_service.apply_progress(trial, progress)
    assert (trial.status, trial.status_reason, trial.started_at is not None, trial.finished_at is not None) == expected
    assert trial.error == steps[-1].get("error")
    assert not trials_service.apply_progress(trial, steps[-1])  # the same progress again changes nothing


def test_a_pending_cancel_keeps_saying_so_until_the_job_ends():
    trial = Trial(name="t", spec=TRIAL_SPEC, implementations=["sdpa"], steps=2, author="t", cancel_requested=True,
                  status_reason=trials_service.CANCELLING)
    assert trials_service.apply_progress(trial, _progress("running", "measuring sdpa (1 of 1, 2 steps)"))
    assert (trial.status, trial.status_reason) == ("running", trials_service.CANCELLING)
    assert trials_service.apply_progress(trial, _progress("cancelled", "cancelled by the user"))
    assert (trial.status, trial.status_reason) == ("cancelled", "cancelled by the user")


def torch_in_process(pid: int) -> list[str]:
    """The torch libraries mapped into a live process (``/proc/<pid>/maps``): empty when it never imported
    torch (an import maps ``libtorch*.so`` and ``torch/_C*.so`` and cannot unmap them)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted({line.split()[-1] for line in maps.splitlines() if "libtorch" in line or "/torch/_C" in line})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """The real app (``attnboard serve``) on the embedded default: its own Ray head with 2 CPUs, one warm rank."""
    data = tmp_path_factory.mktemp("served-trials")
    db_url = f"sqlite:///{data / 'attnboard.db'}"
    app = AppProcess(app_env(ray_env(None), data_dir=data / "data", database_url=db_url, num_cpus=2),
                     log=data / "app.log").start()
    try:
        with httpx.Client(base_url=app.url, headers=token_headers(db_url), timeout=60) as client:
            yield app, client, data / "data"
    finally:
        app.stop()
        record = HeadRecord.load(data / "data" / HEAD_RECORD)
        if record is not None and pid_alive(record.pid):
            stop_head(record.pid)


def wait_for_trial(client: httpx.Client, trial_id: int, predicate, *, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    trial = client.get(f"/api/trials/{trial_id}").json()
    while not predicate(trial) and time.monotonic() < deadline:
        time.sleep(0.5)
        trial = client.get(f"/api/trials/{trial_id}").json()
    return trial


@pytest.mark.ray
def test_cpu_trial_through_the_served_app_on_the_engine(served):
    """The real app runs a trial as a job of its engine host end to end; the app's own process never
    imports torch (the steps, the probe and the parity check all run on ranks)."""
    app, client, _ = served
    assert app.proc is not None
    resp = client.post("/api/trials", json={"name": "cpu", "spec": TRIAL_SPEC,
                                            "implementations": ["eager", "sdpa", "flash_attention_2"],
                                            "steps": 2})  # no environment: probed on a rank
    assert resp.status_code == 202, resp.text
    trial_id = resp.json()["id"]
    trial = wait_for_trial(client, trial_id, lambda t: t["status"] not in ("queued", "running"))
    assert trial["status"] == "succeeded", (trial["error"], app.tail())
    assert trial["engine_job"] == f"attnboard-trial-{trial_id}"
    assert trial["status_reason"] == ("eager, sdpa completed; flash_attention_2 skipped: "
                                      + trial["result"]["columns"][2]["reason"])
    result = TrialResult.from_dict(trial["result"])
    assert (result.environment["name"], result.environment["device"]) == ("probed node", "cpu")
    assert [c.implementation for c in result.columns] == ["eager", "sdpa", "flash_attention_2"]
    fa2 = result.column("flash_attention_2")  # the probed CPU node cannot load it: skipped with the reason
    assert fa2.status == "skipped" and "flash-attn" in fa2.reason
    for impl in ("eager", "sdpa"):
        column = result.column(impl)
        assert column.status == "ok", column.reason
        assert [s.step for s in column.steps] == [1, 2]
        assert column.tokens_per_s > 0 and column.step_time_s > 0 and column.peak_memory_mb > 0
        assert set(column.observed.values()) == {impl}  # every role's first forward ran this kernel
        assert column.parity_max_abs_diff <= result.tolerance and column.parity_ok
    # The spec computes in verl's default bf16: parity is checked in bf16, with bf16's tolerance (the tiny
    # model's logits are below 1, so 32 bf16 ulps at scale 1).
    assert result.tolerance == pytest.approx(32 * 2.0**-7)
    eager = result.column("eager")  # eager's own packed (remove-padding) case against its padded logits: bf16 rounding
    assert eager.parity_max_abs_diff == eager.packed_parity_max_abs_diff <= result.tolerance
    assert all(c.packed_forward_tokens_per_s > 0 and c.remove_padding["rule"] == "remove-padding-cost"
               for c in result.columns if c.status == "ok")
    assert TrialResult.from_dict(result.as_dict()) == result
    assert result.recommendation.implementation in ("eager", "sdpa")
    assert "ms per step" in result.recommendation.reason
    assert torch_in_process(app.proc.pid) == []
    assert client.post(f"/api/trials/{trial_id}/cancel").status_code == 409  # it has ended


@pytest.mark.ray
def test_a_running_trial_is_cancelled_through_the_api(served):
    app, client, _ = served
    trial_id = client.post("/api/trials", json={"name": "stop me", "spec": TRIAL_SPEC, "steps": 20,
                                                "implementations": ["sdpa", "eager"], "environment": "cpu"}).json()["id"]
    trial = wait_for_trial(client, trial_id, lambda t: (t["status_reason"] or "").startswith("measuring"), timeout=300)
    assert trial["status"] == "running", (trial, app.tail())
    asked = time.monotonic()
    resp = client.post(f"/api/trials/{trial_id}/cancel")
    assert resp.status_code == 200 and resp.json()["status_reason"] == trials_service.CANCELLING
    trial = wait_for_trial(client, trial_id, lambda t: t["status"] != "running", timeout=60)
    assert (trial["status"], trial["status_reason"]) == ("cancelled", "cancelled by the user"), app.tail()
    assert time.monotonic() - asked < 30


@pytest.mark.ray
def test_a_trial_whose_engine_host_dies_is_restarted_or_failed_with_the_cause(served):
    """Two trials run side by side (1 CPU each: ``attnboard.rank_cpus: 1``, else a rank of one takes both of the
    head's CPUs); the engine host is SIGKILLed: the one that may not restart (``attnboard.max_restarts: 0``)
    fails naming the host, the other starts again in a new host and ends."""
    app, client, data = served
    ids = [client.post("/api/trials", json={"name": name, "spec": {**TRIAL_SPEC, "attnboard.max_restarts": limit,
                                                                   "attnboard.rank_cpus": 1},
                                            "implementations": ["eager", "sdpa"], "steps": 20,
                                            "environment": "cpu"}).json()["id"] for name, limit in (("once", 0),
                                                                                                  ("again", 2))]
    for trial_id in ids:
        trial = wait_for_trial(client, trial_id, lambda t: (t["status_reason"] or "").startswith("measuring"),
                               timeout=300)
        assert trial["status"] == "running", (trial, app.tail())
    record = HeadRecord.load(data / HEAD_RECORD)
    assert record is not None
    hosts = ray_query(record.address, ray_env(None))["hosts"]
    (name, host_pid), = hosts.items()
    os.kill(host_pid, signal.SIGKILL)

    once = wait_for_trial(client, ids[0], lambda t: t["status"] not in ("queued", "running"), timeout=120)
    assert once["status"] == "failed" and once["restarts"] == 0, once
    assert once["status_reason"].startswith(f"the engine host is gone: trial job attnboard-trial-{ids[0]} ")
    assert once["error"] == once["status_reason"]
    again = wait_for_trial(client, ids[1], lambda t: t["status"] not in ("queued", "running"))
    assert again["status"] == "succeeded" and again["restarts"] == 1, (again, app.tail())
    assert [c["status"] for c in again["result"]["columns"]] == ["ok", "ok"]
    assert ray_query(record.address, ray_env(None))["hosts"].get(name) not in (None, host_pid)  # a new host


def test_at_start_up_only_trials_that_ran_inside_an_old_app_end_failed(db_url):
    """No trial stays non-terminal after the process that ran it is gone: a trial ``running`` without a job
    in the engine host ran in an old app's thread and is failed at start-up; a queued trial waits for the
    scheduler, and one with a job is followed by the supervisor (its host outlives the app)."""
    from fastapi.testclient import TestClient
    from sqlmodel import Session

    from app.db import make_engine
    from app.main import create_app
    from app.models_troubleshooting import Trial, TrialStatus
    from app.services.trials import LEGACY_ORPHANED
    from tests.app.factories import tiny_spec

    engine = make_engine(db_url)
    with Session(engine) as session:
        rows = [Trial(name=f"t{i}", status=s, spec=tiny_spec(), implementations=["eager"], steps=1, author="test",
                      engine_job=job)
                for i, (s, job) in enumerate([(TrialStatus.queued.value, None), (TrialStatus.running.value, None),
                                              (TrialStatus.succeeded.value, None),
                                              (TrialStatus.running.value, "attnboard-trial-4")])]
        session.add_all(rows)
        session.commit()
        ids = [r.id for r in rows]
    from app.core.config import Settings

    with TestClient(create_app(Settings(DATABASE_URL=db_url))):
        pass
    with Session(engine) as session:
        statuses = [(session.get(Trial, i).status, session.get(Trial, i).error) for i in ids]
    engine.dispose()
    assert statuses[1] == (TrialStatus.failed.value, LEGACY_ORPHANED)
    assert [s for s, _ in statuses] == ["queued", "failed", "succeeded", "running"]
