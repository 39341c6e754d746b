"""Attention trials over the API and the pages: validation, a real CPU trial in the background (eager vs
sdpa on the tiny model, through Ray), stored results compared side by side, the new-run form's button."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlmodel import Session

from app.models_troubleshooting import Trial, TrialCreate, TrialStatus
from app.routes.trials import get_trial_starter
from app.services import trials as trials_service
from tests.app.factories import tiny_spec
from tests.app.pages_support import csrf_of, login, soup
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
    resp = client.post("/trials/from-form", data=data, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    trial = client.get(f"/api/trials/{started[0]}").json()
    assert resp.headers["location"] == f"/trials/{trial['id']}"
    assert (trial["name"], trial["steps"], trial["status"]) == ("trial: form trial", 2, "queued")
    assert trial["implementations"] == ["flash_attention_2", "sdpa", "eager"]
    bad = client.post("/trials/from-form", data={**data, "trial_steps": "0"}, follow_redirects=False)
    assert bad.status_code == 422
    assert csrf_of(client.get(f"/trials/{trial['id']}").text) == csrf


# --------------------------------------------------------------------------------------------
# A real trial through the API


@pytest.mark.ray
def test_cpu_trial_through_the_api(client, write_headers, db_backend, local_ray):
    if db_backend != "sqlite":
        pytest.skip("the engine trial runs once, on SQLite")
    resp = client.post("/api/trials", json={"name": "cpu", "spec": TRIAL_SPEC,
                                            "implementations": ["eager", "sdpa", "flash_attention_2"],
                                            "steps": 2}, headers=write_headers)  # no environment: probed on Ray
    assert resp.status_code == 202, resp.text
    trial_id = resp.json()["id"]
    deadline = time.monotonic() + 600
    trial = resp.json()
    while trial["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(1.0)
        trial = client.get(f"/api/trials/{trial_id}").json()
    assert trial["status"] == "succeeded", trial["error"]
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
    page = soup(client.get(f"/trials/{trial_id}").text)
    assert page.select_one("p.recommendation")["data-recommended"] == result.recommendation.implementation


def test_trials_a_stopped_app_left_running_end_failed_at_start_up(db_url):
    """No trial stays non-terminal after the process that ran it is gone."""
    from fastapi.testclient import TestClient
    from sqlmodel import Session

    from app.db import make_engine
    from app.main import create_app
    from app.models_troubleshooting import Trial, TrialStatus
    from app.services.trials import ORPHANED
    from tests.app.factories import tiny_spec

    engine = make_engine(db_url)
    with Session(engine) as session:
        rows = [Trial(name=f"t{i}", status=s, spec=tiny_spec(), implementations=["eager"], steps=1, author="test")
                for i, s in enumerate([TrialStatus.queued.value, TrialStatus.running.value, TrialStatus.succeeded.value])]
        session.add_all(rows)
        session.commit()
        ids = [r.id for r in rows]
    from app.core.config import Settings

    with TestClient(create_app(Settings(DATABASE_URL=db_url))):
        pass
    with Session(engine) as session:
        statuses = [(session.get(Trial, i).status, session.get(Trial, i).error) for i in ids]
    engine.dispose()
    assert statuses[:2] == [(TrialStatus.failed.value, ORPHANED)] * 2
    assert statuses[2][0] == TrialStatus.succeeded.value
