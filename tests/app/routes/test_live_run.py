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
    assert critic.select_one(".badge").get_text(strip=True).endswith("fallback")
    assert critic.select_one("td.effective").get_text(" ", strip=True) == "flash_attention_2 → sdpa"
    assert critic.select_one("td.observed code").get_text() == "sdpa"
    assert critic.select_one("td.observed .calls").get_text(strip=True) == "(sdpa ×2)"
    backend = critic.select_one("td.observed .sdpa-backend")  # the kernel below sdpa: CPU's fused flash kernel
    assert backend["data-backend"] == "flash_attention" and critic.select_one("td.observed .sdpa-reason") is None
    assert backend.select_one("code")["title"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert critic.select_one("td.strategy .precision").get_text(strip=True) == "fp32 / fp32"
    entry = page.select_one("#trouble li.kind-fallback")
    assert entry.select_one(".summary").get_text() == "flash_attention_2 requested but flash-attn is not installed"
    assert "FlashAttention2 has been toggled on" in entry.select_one(".message").get_text()
    assert "Remedy:" in entry.select_one(".remedy").get_text()
    assert page.select_one("form[action$='/retry'] input[name='eager_on'][value='critic']") is not None
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

