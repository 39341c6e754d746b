"""The live run page, its event stream and its actions."""

from __future__ import annotations

import json

import pytest

from tests.app.pages_support import (
    csrf_of,
    engine_events,
    login,
    parse_sse,
    soup,
    stored_run,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_live_page_of_a_finished_run(client, session):
    run_id = stored_run(session, name="done", events=engine_events("critic_fallback"))
    page = soup(client.get(f"/runs/{run_id}").text)
    assert page.select_one("#status")["data-status"] == "succeeded"
    assert page.select_one("#progress-bar")["value"] == "100"
    assert page.select_one("#live").get("sse-connect") is None, "a finished run opens no stream"
    critic = page.select_one("#attention tr[data-role='critic'][data-rank='0']")
    assert critic.select_one(".badge")["data-badge"] == "fallback"
    assert critic.select_one(".badge").get_text(strip=True).endswith("fell back")
    assert critic.select_one("td.effective").get_text(" ", strip=True) == "flash_attention_2 → sdpa"
    assert critic.select_one("td.observed code").get_text() == "sdpa"
    assert critic.select_one("td.observed .calls").get_text(strip=True) == "(sdpa ×2)"
    backend = critic.select_one("td.observed .sdpa-backend")  # the kernel below sdpa: CPU's fused flash kernel
    assert backend["data-backend"] == "flash_attention" and critic.select_one("td.observed .sdpa-reason") is None
    assert backend.select_one("code")["title"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert backend.select_one(".backend-words").get_text() == "torch's own fused kernel for CPU, not the flash-attn package"
    assert critic.select_one("td.strategy .precision").get_text(strip=True) == "fp32 / fp32"
    entry = page.select_one("#trouble li.kind-fallback")
    assert entry.select_one(".summary").get_text() == "flash_attention_2 requested but flash-attn is not installed"
    assert "FlashAttention2 has been toggled on" in entry.select_one(".message").get_text()
    assert "Remedy:" in entry.select_one(".remedy").get_text()
    # it succeeded on sdpa: nothing failed, so no "retry with eager" (issue 17 item 3), only the plain retry
    assert page.select("input[name='eager_on']") == [] and page.select("#actions form.eager-remedy") == []
    assert [b.get_text(strip=True) for b in page.select("#actions button")] == ["Retry"]
    points = json.loads(page.select_one("#metric-points").string)
    assert [p["step"] for p in points] == [1, 2]
    assert {"critic/rewards/mean", "perf/tokens_per_s", "peak_memory_mb/rank 1"} <= set(points[0]["values"])
    charts = {f["id"]: json.loads(f["data-keys"]) for f in page.select("figure.chart")}
    assert charts["chart-reward"] == ["critic/rewards/mean", "critic/score/mean"]


MATH_REASON = ("flash_attention (CPU): dropout_p=0.1: the CPU flash kernel takes no dropout (attention_dropout in "
               "training)")


def test_live_page_says_where_sdpa_fell_to_math_and_why(client, session):
    """The engine's payload when the critic's sdpa ran the math backend (as a dropout makes it on CPU)."""
    events = []
    for kind, payload in engine_events("succeeded"):
        if kind == "attention" and payload["role"] == "critic" and payload["rank"] == 1:
            payload = {**payload, "sdpa_backend": "math", "sdpa_backend_reason": MATH_REASON,
                       "compute_dtype": "bfloat16", "sdpa": [{"backend": "math", "op": "aten::_scaled_dot_product_attention_math",
                                                              "calls": 2, "reason": MATH_REASON, "inputs": "bfloat16 cpu"}]}
        events.append((kind, payload))
    page = soup(client.get(f"/runs/{stored_run(session, name='math', events=events)}").text)
    critic = page.select_one("#attention tr[data-role='critic'][data-rank='1']")
    assert critic.select_one(".sdpa-backend")["data-backend"] == "math"
    assert critic.select_one(".sdpa-backend .badge").get_text(strip=True).endswith("math")
    assert critic.select_one(".sdpa-reason").get_text(strip=True) == MATH_REASON
    assert critic.select_one("td.strategy .precision").get_text(strip=True) == "bf16 / fp32"
    other = page.select_one("#attention tr[data-role='critic'][data-rank='0']")
    assert other.select_one(".sdpa-backend")["data-backend"] == "flash_attention"
    probe = page.select_one("#probe dd[data-key='sdpa_backends']")
    assert probe.get_text(strip=True) == "flash_attention, math"


def test_live_page_of_a_role_that_did_not_load(client, session):
    run_id = stored_run(session, name="strict", events=engine_events("critic_strict"))
    page = soup(client.get(f"/runs/{run_id}").text)
    assert page.select_one("#status")["data-status"] == "failed"
    critic = page.select_one("#attention tr[data-role='critic']")
    assert critic.select_one(".badge")["data-badge"] == "error"
    assert critic.select_one(".badge").get_text(strip=True).endswith("error")
    assert "did not load" in critic.select_one("td.effective").get_text()
    assert page.select_one("#trouble li.kind-error .summary").get_text() == \
        "flash_attention_2 requested but flash-attn is not installed"
    assert [b.get_text(strip=True) for b in page.select("#actions button")] == ["Retry", "Retry with eager on the critic"]


def test_retry_with_eager_on_the_critic(client, session):
    login(client, session, ["read", "write"])
    run_id = stored_run(session, name="fell back", events=engine_events("critic_fallback"))
    page = client.get(f"/runs/{run_id}").text
    resp = client.post(f"/runs/{run_id}/retry", data={"eager_on": "critic", "csrf_token": csrf_of(page)},
                       follow_redirects=False)
    assert resp.status_code == 303
    new = soup(client.get(resp.headers["location"]).text)
    assert f"retry of #{run_id}" in new.select_one(".run-head").get_text(" ", strip=True)


@pytest.mark.parametrize("resume", [0, 4, 9])
def test_stream_resumes_after_last_event_id_without_repeats(client, session, resume):
    events = engine_events(steps=5)
    run_id = stored_run(session, name="streamed", events=events)
    resp = client.get(f"/runs/{run_id}/stream", headers={"Last-Event-ID": str(resume)})
    assert resp.headers["content-type"].startswith("text/event-stream")
    messages = parse_sse(resp.text)
    ids = [int(m["id"]) for m in messages if "id" in m]
    assert ids == list(range(resume + 1, len(events) + 1))
    assert messages[-1]["event"] == "end"



def test_one_retry_with_eager_patches_every_failing_setting_with_the_remedys_words(client, session):
    """Issue 17 item 3: the button, its sentence and the patch come from one rule (classify.eager_remedy, the one
    the preview's preflight applies); a retry naming the actor and the critic sets eager on both, so one retry
    recovers every role that failed the same way."""
    login(client, session, ["read", "write"])
    run_id = stored_run(session, name="strict", events=engine_events("critic_strict"))
    html = client.get(f"/runs/{run_id}").text
    page = soup(html)
    forms = page.select("#actions form.eager-remedy")
    assert len(forms) == 1
    assert [i["value"] for i in forms[0].select("input[name='eager_on']")] == ["critic"]
    sentence = page.select_one("#actions .remedy-sentence").get_text()
    assert sentence.startswith("Fall back to eager on the critic") and \
        "critic.model.override_config.attn_implementation=eager" in sentence
    resp = client.post(f"/runs/{run_id}/retry", data={"eager_on": ["actor", "critic"], "csrf_token": csrf_of(html)},
                       follow_redirects=False)
    assert resp.status_code == 303, resp.text
    spec = client.get(f"/api/runs/{int(resp.headers['location'].rsplit('/', 1)[1])}").json()["spec"]
    assert spec["actor_rollout_ref"]["model"]["override_config"]["attn_implementation"] == "eager"
    assert spec["critic"]["model"]["override_config"]["attn_implementation"] == "eager"
    bad = client.post(f"/runs/{run_id}/retry", data={"eager_on": "rollout", "csrf_token": csrf_of(html)})
    assert bad.status_code == 422 and "eager_on 'rollout' is not a role with its own attention setting" in bad.text


def test_a_queued_run_says_what_it_waits_for_on_its_page_and_in_the_list(client, session):
    """Issue 17 item 2: the scheduler's reason (no event carries it) is on the page, polled while queued, and in
    the list; once the run left the queue the poll answers 286 (htmx stops)."""
    from app.models import Run

    run_id = stored_run(session, name="waits")
    run = session.get(Run, run_id)
    run.status_reason = "waiting for 8 CPU (2 free of 2)"
    session.add(run)
    session.commit()
    page = soup(client.get(f"/runs/{run_id}").text)
    waiting = page.select_one("#waiting")
    assert waiting.get_text(strip=True) == "waiting for 8 CPU (2 free of 2)"
    assert waiting["hx-get"] == f"/runs/{run_id}/waiting"
    polled = client.get(f"/runs/{run_id}/waiting", headers={"HX-Request": "true"}).text
    assert soup(polled).select_one("body") is None  # the fragment only
    assert soup(polled).select_one("#waiting").get_text(strip=True) == "waiting for 8 CPU (2 free of 2)"
    listed = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}'] .status-reason")
    assert listed.get_text(strip=True) == "waiting for 8 CPU (2 free of 2)"
    run.status = "cancelled"
    session.add(run)
    session.commit()
    assert client.get(f"/runs/{run_id}/waiting").status_code == 286


def test_run_page_shows_the_spec_times_and_what_to_do_with_them(client, session):
    run_id = stored_run(session, name="tiny", events=engine_events("succeeded", steps=3))
    page = soup(client.get(f"/runs/{run_id}").text)
    changed = [tr["data-key"] for tr in page.select("#spec table.spec-changed tbody tr")]
    assert "trainer.device" in changed and "actor_rollout_ref.actor.optim.lr" not in changed  # differs first
    device = page.select_one("#spec tr[data-key='trainer.device']").get_text(" ", strip=True)
    assert device == "trainer.device cpu cuda"  # this run, then verl's default
    assert "actor_rollout_ref.actor.optim.lr" in page.select_one("#spec details.spec-same").get_text()
    assert page.select_one(".run-meta time") is not None
    assert page.select_one("#edit-relaunch")["href"] == f"/runs/new?from={run_id}"
    steps = [li.get_text(" ", strip=True) for li in page.select("#logs li.kind-step")]
    assert [s.split(":")[0] for s in steps] == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert "tokens/s" in steps[0]
    assert "Trials" in [a.get_text(strip=True) for a in page.select("nav a")]


def test_edit_and_relaunch_fills_the_form_with_the_run(client, session):
    run_id = stored_run(session, name="tiny to edit", events=[],
                        **{"critic.model.override_config.attn_implementation": "eager"})
    page = soup(client.get(f"/runs/new?from={run_id}").text)
    assert page.select_one("#f-name")["value"] == "tiny to edit"
    critic = page.select_one("select[name='critic.model.override_config.attn_implementation'] option[selected]")
    assert critic["value"] == "eager"
    assert page.select_one("input[name='data.train_batch_size']")["value"] == "4"
    assert client.get("/runs/new?from=999999").status_code == 404


def test_run_exports_and_downloads(client, session):
    run_id = stored_run(session, name="tiny", events=engine_events("succeeded", steps=3))
    command = client.get(f"/runs/{run_id}/export/command")
    assert command.status_code == 200 and "verl.trainer.main_ppo" in command.text
    assert "trainer.device=cpu" in command.text
    spec_yaml = client.get(f"/runs/{run_id}/export.yaml")
    assert spec_yaml.headers["content-disposition"] == f'attachment; filename="run-{run_id}.yaml"'
    assert "device: cpu" in spec_yaml.text
    lines = client.get(f"/runs/{run_id}/events.jsonl").text.splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {"status", "attention", "metric", "log"} <= {e["kind"] for e in events}
    rows = client.get(f"/runs/{run_id}/metrics.csv").text.splitlines()
    header = rows[0].split(",")
    assert header[0] == "step" and "perf/tokens_per_s" in header and len(rows) == 4
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]


def test_a_run_that_ended_before_its_first_step_says_so_instead_of_empty_charts(client, session):
    run_id = stored_run(session, name="strict", events=engine_events("critic_strict"),
                        **{"critic.model.override_config.attn_implementation": "flash_attention_2"})
    page = soup(client.get(f"/runs/{run_id}").text)
    assert page.select_one("figure.chart") is None
    assert page.select_one("#no-metrics").get_text() == "No metrics: the run ended before its first step."
    changed = [tr["data-key"] for tr in page.select("#spec table.spec-changed tbody tr")]
    assert "critic.model.override_config.attn_implementation" in changed
    assert "critic.model.override_config" not in changed  # the emptied mapping is the same change, shown once


def test_a_stored_spec_that_no_longer_parses_is_named_not_a_crash(client, session):
    from app.models import Run

    run_id = stored_run(session, name="old")
    run = session.get(Run, run_id)
    run.spec = {**run.spec, "trainer": {**run.spec["trainer"], "total_training_steps": "many"}}
    session.add(run)
    session.commit()
    for path in (f"/runs/new?from={run_id}", f"/runs/{run_id}/export/command", f"/runs/{run_id}/export.yaml"):
        resp = client.get(path, headers={"Accept": "application/json"})
        assert resp.status_code == 409, path
        assert resp.json()["error"]["field"] == "spec"
    assert client.get(f"/runs/{run_id}").status_code == 200  # the page still shows, without the spec panel
