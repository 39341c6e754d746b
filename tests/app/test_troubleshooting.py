"""The troubleshooting log: entries from ingested events, filters, notes, retry with the remedy, the return
to the fast path, auth, and the pages. Events are the engine's own payload shapes (see
``worker.engine.plan.fallback_payloads`` and ``trainer.RoleFailure``); the end-to-end test with the real
engine is in ``test_troubleshooting_engine.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.models_troubleshooting import EntrySource
from app.services.troubleshooting import diagnose, draft_from_event, environment_label
from tests.app.factories import engine_headers, make_run
from tests.app.pages_support import csrf_of, login, soup

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

FA2_MISSING = ("ImportError: FlashAttention2 has been toggled on, but it cannot be used due to the following error: "
               "the package for FlashAttention2 doesn't seem to be installed.")
CPU_PROBE = {"rank": 0, "device": "cpu", "compute_capability": None, "gpu_name": None, "flash_attn_version": None,
             "transformers_version": "5.24.0", "torch_version": "2.13.0", "kernels_installed": False, "hostname": "vm"}
A100_PROBE = {**CPU_PROBE, "device": "cuda", "compute_capability": [8, 0], "gpu_name": "A100",
              "flash_attn_version": "2.8.3"}
ACTOR_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_KEY = "critic.model.override_config.attn_implementation"


def fallback(role: str, error: str = FA2_MISSING) -> dict[str, Any]:
    return {"role": role, "rank": 0, "from": "flash_attention_2", "to": "sdpa", "error": error, "diagnosis": {}}


def post_events(client, headers, run_id: int, events: list[tuple[str, dict[str, Any]]], start: int = 1) -> None:
    body = [{"seq": start + i, "kind": kind, "payload": payload} for i, (kind, payload) in enumerate(events)]
    resp = client.post(f"/api/runs/{run_id}/events", json=body, headers=engine_headers(client, run_id))
    assert resp.status_code == 200, resp.text


def fallback_run(client, headers, name: str = "fa2 on cpu", probe: dict[str, Any] = CPU_PROBE,
                 end: dict[str, Any] | None = None, **spec: Any) -> int:
    """A run whose actor and critic fell back from flash_attention_2, ending with ``end`` (default: succeeded)."""
    run = make_run(client, headers, name=name, **{"attnboard.fallback_policy": "fallback", **spec})
    post_events(client, headers, run["id"], [
        ("status", {"status": "starting"}), ("env_probe", probe), ("fallback", fallback("actor")),
        ("fallback", fallback("critic")), ("status", {"status": "running"}),
        ("status", end or {"status": "succeeded"})])
    return run["id"]


FAILED = {"status": "failed", "reason": "CUDA out of memory."}


def entries(client, **params: Any) -> dict[str, Any]:
    resp = client.get("/api/troubleshooting", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


# --------------------------------------------------------------------------------------------
# Pure


@pytest.mark.parametrize("kind,payload,run_has_error,expected", [
    ("fallback", fallback("critic"), False, (EntrySource.fallback, "critic", FA2_MISSING, "flash_attention_2")),
    ("fallback", {"role": "nobody", "message": "boom"}, False, (EntrySource.fallback, None, "boom", None)),
    ("error", {"message": "[critic] rank 0: x", "role": "critic",
               "attempts": [{"implementation": "sdpa", "ok": False, "error": "ValueError: sdpa broke"}]}, False,
     (EntrySource.error, "critic", "ValueError: sdpa broke", "sdpa")),
    ("error", {"message": "RuntimeError: oops", "traceback": "Traceback (most recent call last):\nRuntimeError: oops"},
     False, (EntrySource.error, None, "Traceback (most recent call last):\nRuntimeError: oops", None)),
    ("status", {"status": "failed", "reason": "workers gone"}, False, (EntrySource.failed, None, "workers gone", None)),
    ("status", {"state": "failed", "reason": "engine wording"}, False, (EntrySource.failed, None, "engine wording", None)),
    ("status", {"status": "failed", "reason": "explained"}, True, None),
    ("status", {"status": "succeeded"}, False, None),
    ("attention_mismatch", {"role": "critic", "rank": 1, "what": "loaded-vs-observed", "expected": "sdpa",
                            "actual": "eager", "message": "[critic] rank 1 loaded sdpa, but the first forward called eager"},
     False, (EntrySource.mismatch, "critic", "[critic] rank 1 loaded sdpa, but the first forward called eager", "sdpa")),
    ("attention_mismatch", {"role": "actor", "expected": "flash_attention_2", "actual": None}, True,
     (EntrySource.mismatch, "actor", "expected flash_attention_2, got nothing", "flash_attention_2")),
    ("metric", {"step": 1}, False, None),
    ("attention", {"role": "actor"}, False, None),
])
def test_draft_from_event(kind, payload, run_has_error, expected):
    draft = draft_from_event(kind, payload, run_has_error=run_has_error)
    if expected is None:
        assert draft is None
    else:
        assert (draft.source, draft.role, draft.error, draft.implementation) == expected


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=40),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
                           max_leaves=10)
payloads = st.dictionaries(st.sampled_from(["role", "error", "message", "attempts", "traceback", "from", "status",
                                            "state", "reason", "expected", "actual"]), json_values, max_size=6)
probes = st.none() | st.dictionaries(st.sampled_from(["device", "compute_capability", "flash_attn_version",
                                                      "gpu_name", "transformers_version"]), json_values, max_size=4)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["fallback", "error", "status", "attention_mismatch", "metric", "log"]), payloads, st.booleans(),
       probes)
def test_any_payload_is_ingested_without_raising(kind, payload, run_has_error, probe):
    """Ingestion runs inside every POST /events: whatever a worker sends, it yields a draft or nothing, and a
    draft always classifies (a probe it cannot read is ignored)."""
    draft = draft_from_event(kind, payload, run_has_error=run_has_error)
    if draft is not None:
        assert draft.error.strip()
        assert diagnose(draft, probe).summary
        environment_label(probe, None)


@pytest.mark.parametrize("probe,fallback_env,expected", [
    (CPU_PROBE, None, "cpu, no flash-attn"),
    (A100_PROBE, None, "cuda sm80 A100, flash-attn 2.8.3"),
    (None, "cuda-sm75", "cuda-sm75"),
    (None, {"name": "probe", "device": "cpu"}, "probe"),
    (None, None, None),
])
def test_environment_label(probe, fallback_env, expected):
    assert environment_label(probe, fallback_env) == expected


# --------------------------------------------------------------------------------------------
# Ingestion


def test_fallback_events_become_classified_entries_once(client, write_headers):
    run_id = fallback_run(client, write_headers)
    found = entries(client)
    assert found["total"] == 2
    critic, actor = found["data"]  # newest first
    assert (critic["role"], actor["role"]) == ("critic", "actor")
    assert critic["run_id"] == run_id and critic["seq"] == 4 and critic["source"] == "fallback"
    assert critic["category"] == "flash_attn_not_installed"
    assert critic["environment"] == "cpu, no flash-attn" and critic["model"] == "builtin:tiny-llama"
    assert critic["error"] == FA2_MISSING
    assert critic["diagnosis"]["step"] == "fall_back_to_eager"
    assert critic["diagnosis"]["remedy"]["patch"] == {CRITIC_KEY: "eager"}  # the guide's step, as the button says
    assert "cannot run it either" in critic["diagnosis"]["remedy"]["sentence"]  # the CPU probe was used
    assert actor["diagnosis"]["remedy"]["patch"] == {ACTOR_KEY: "eager"}
    assert critic["return_to_fast_path"] is None
    # Ingestion is idempotent on (run_id, seq): a re-sent batch makes no new entries.
    post_events(client, write_headers, run_id, [("status", {"status": "starting"}), ("env_probe", CPU_PROBE),
                                                ("fallback", fallback("actor"))])
    assert entries(client)["total"] == 2


def test_an_error_event_explains_the_failed_status_and_a_bare_failure_gets_its_own_entry(client, write_headers):
    strict = make_run(client, write_headers, name="strict")
    post_events(client, write_headers, strict["id"], [
        ("status", {"status": "starting"}), ("env_probe", CPU_PROBE),
        ("error", {"message": "[actor] rank 0: ImportError", "role": "actor", "rank": 0, "policy": "strict",
                   "attempts": [{"implementation": "flash_attention_2", "ok": False, "error": FA2_MISSING}]}),
        ("status", {"status": "failed", "reason": "[actor] rank 0: ImportError"})])
    bare = make_run(client, write_headers, name="bare")
    post_events(client, write_headers, bare["id"], [("status", {"status": "starting"}),
                                                    ("status", {"status": "failed", "reason": "CUDA out of memory."})])
    only_strict = entries(client, run_id=strict["id"])
    assert [(e["source"], e["category"]) for e in only_strict["data"]] == [("error", "flash_attn_not_installed")]
    assert only_strict["data"][0]["implementation"] == "flash_attention_2"
    only_bare = entries(client, run_id=bare["id"])
    assert [(e["source"], e["category"], e["environment"]) for e in only_bare["data"]] == [("failed", "out_of_memory", None)]


def test_an_attention_mismatch_is_logged_with_the_kernel_that_was_expected(client, write_headers):
    """A role that loaded sdpa but whose first forward called eager fell back silently: the log has it."""
    run = make_run(client, write_headers, name="mismatch")
    message = "[critic] rank 0 loaded sdpa, but the first forward called eager ({'eager': 2})"
    post_events(client, write_headers, run["id"], [
        ("status", {"status": "starting"}), ("env_probe", CPU_PROBE),
        ("attention_mismatch", {"role": "critic", "rank": 0, "what": "loaded-vs-observed", "expected": "sdpa",
                                "actual": "eager", "calls": {"eager": 2}, "message": message})])
    found = entries(client, run_id=run["id"])["data"]
    assert [(e["source"], e["role"], e["implementation"], e["error"]) for e in found] == [
        ("mismatch", "critic", "sdpa", message)]
    assert found[0]["environment"] == "cpu, no flash-attn" and found[0]["diagnosis"]["summary"]


def test_filters(client, write_headers):
    cpu = fallback_run(client, write_headers, name="cpu")
    t4 = fallback_run(client, write_headers, name="t4", probe={**CPU_PROBE, "device": "cuda", "compute_capability": [7, 5],
                                                               "gpu_name": "Tesla T4"},
                      **{"actor_rollout_ref.model.path": "builtin:tiny-qwen2"})
    assert entries(client)["total"] == 4
    assert {e["run_id"] for e in entries(client, environment="t4")["data"]} == {t4}
    assert {e["run_id"] for e in entries(client, environment="CPU, NO")["data"]} == {cpu}
    by_model = entries(client, model="qwen2")["data"]
    assert [(e["run_id"], e["role"]) for e in by_model] == [(t4, "actor")]  # the critic of t4 is tiny-llama
    assert [e["run_id"] for e in entries(client, role="critic")["data"]] == [t4, cpu]
    assert entries(client, category="unsupported_hardware")["total"] == 0
    assert entries(client, category="flash_attn_not_installed", run_id=cpu)["total"] == 2
    page = entries(client, limit=1, offset=1)
    assert page["total"] == 4 and len(page["data"]) == 1 and page["data"][0]["run_id"] == t4


@pytest.mark.parametrize("params,field,valid", [
    ({"limit": 0}, "limit", None), ({"run_id": 0}, "run_id", None), ({"model": "x" * 201}, "model", None),
    ({"category": "flash"}, "category", "flash_attn_not_installed"), ({"role": "ref"}, "role", "reference"),
])
def test_bad_filters_name_the_field(client, params, field, valid):
    resp = client.get("/api/troubleshooting", params=params)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["field"] == field
    if valid is not None:
        assert valid in error["valid"] and valid in error["message"]


# --------------------------------------------------------------------------------------------
# Notes, retry, auth


def test_notes(client, write_headers, read_headers):
    fallback_run(client, write_headers)
    entry_id = entries(client)["data"][0]["id"]
    resp = client.post(f"/api/troubleshooting/{entry_id}/notes", json={"text": "flash-attn wheel missing on CPU"},
                       headers=write_headers)
    assert resp.status_code == 201, resp.text
    assert resp.json()["author"] == "test-read-write"
    got = client.get(f"/api/troubleshooting/{entry_id}").json()
    assert [n["text"] for n in got["notes"]] == ["flash-attn wheel missing on CPU"]
    assert client.post(f"/api/troubleshooting/{entry_id}/notes", json={"text": ""}, headers=write_headers).json()[
        "error"]["field"] == "text"
    assert client.post(f"/api/troubleshooting/{entry_id}/notes", json={"text": "x"}, headers=read_headers).status_code == 403
    missing = client.post("/api/troubleshooting/999999/notes", json={"text": "x"}, headers=write_headers)
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "entry_id"


def test_retry_with_the_remedy_patches_the_spec(client, write_headers):
    run_id = fallback_run(client, write_headers)
    critic = entries(client, role="critic")["data"][0]
    resp = client.post(f"/api/troubleshooting/{critic['id']}/retry", headers=write_headers)
    assert resp.status_code == 201, resp.text
    new = resp.json()
    assert new["retry_of"] == run_id and new["status"] == "queued"
    assert new["spec"]["critic"]["model"]["override_config"]["attn_implementation"] == "eager"
    assert new["spec"]["actor_rollout_ref"]["model"]["override_config"].get("attn_implementation") is None


def test_retry_refuses_what_it_cannot_do(client, write_headers):
    bare = make_run(client, write_headers, name="bare")
    post_events(client, write_headers, bare["id"], [("status", {"status": "starting"}),
                                                    ("status", {"status": "failed", "reason": "something odd"})])
    entry = entries(client)["data"][0]
    assert entry["category"] == "other" and entry["diagnosis"]["remedy"]["patch"] == {}
    no_patch = client.post(f"/api/troubleshooting/{entry['id']}/retry", headers=write_headers)
    assert no_patch.status_code == 409 and no_patch.json()["error"]["code"] == "no_spec_remedy"
    bad_use = client.post(f"/api/troubleshooting/{entry['id']}/retry", json={"use": "magic"}, headers=write_headers)
    assert bad_use.status_code == 422 and bad_use.json()["error"]["valid"] == ["remedy", "fast_path"]


def test_every_mutating_route_needs_a_write_token(client, read_headers):
    paths = client.get("/openapi.json").json()["paths"]
    mutating = [(path, method) for path, item in paths.items() if path.startswith(("/api/troubleshooting", "/api/trials"))
                for method in item if method in ("post", "put", "patch", "delete")]
    assert len(mutating) == 5  # recheck, notes, retry; a trial, its cancel
    for path, method in mutating:
        url = path.replace("{entry_id}", "1").replace("{trial_id}", "1")
        assert client.request(method, url, json={}).status_code == 401, url
        assert client.request(method, url, json={}, headers=read_headers).status_code == 403, url


# --------------------------------------------------------------------------------------------
# Back to the fast path


def test_a_newer_runs_probe_with_flash_attn_suggests_returning_to_it(client, write_headers):
    fallback_run(client, write_headers)
    critic = entries(client, role="critic")["data"][0]
    refused = client.post(f"/api/troubleshooting/{critic['id']}/retry", json={"use": "fast_path"}, headers=write_headers)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "cause_not_gone"
    # A newer run on the same CPU changes nothing; one on an A100 with flash-attn does.
    fallback_run(client, write_headers, name="still cpu")
    assert client.get(f"/api/troubleshooting/{critic['id']}").json()["return_to_fast_path"] is None
    later = make_run(client, write_headers, name="on the cluster")
    post_events(client, write_headers, later["id"], [("status", {"status": "starting"}), ("env_probe", A100_PROBE)])
    fast = client.get(f"/api/troubleshooting/{critic['id']}").json()["return_to_fast_path"]
    assert fast["patch"] == {CRITIC_KEY: "flash_attention_2"}
    assert fast["probe"] == f"run {later['id']}"
    assert "return to flash_attention_2" in fast["sentence"] and "flash-attn 2.8.3" in fast["sentence"]
    resp = client.post(f"/api/troubleshooting/{critic['id']}/retry", json={"use": "fast_path"}, headers=write_headers)
    assert resp.status_code == 201
    assert resp.json()["spec"]["critic"]["model"]["override_config"]["attn_implementation"] == "flash_attention_2"


def test_recheck_with_a_probe(client, write_headers, read_headers):
    fallback_run(client, write_headers)
    still_cpu = client.post("/api/troubleshooting/recheck", json={"environment": "cpu"}, headers=write_headers)
    assert still_cpu.status_code == 201 and still_cpu.json()["suggestions"] == []
    resp = client.post("/api/troubleshooting/recheck", json={"environment": A100_PROBE}, headers=write_headers)
    assert resp.status_code == 201, resp.text
    suggestions = resp.json()["suggestions"]
    assert {s["role"] for s in suggestions} == {"actor", "critic"}
    assert all(s["return_to_fast_path"]["probe"] == f"recheck {resp.json()['id']}" for s in suggestions)
    listed = entries(client)["data"]
    assert all(e["return_to_fast_path"] is not None for e in listed)  # stored: the log shows it from now on
    bad = client.post("/api/troubleshooting/recheck", json={"environment": {**A100_PROBE, "device": "tpu"}},
                      headers=write_headers)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "environment.device"
    unknown = client.post("/api/troubleshooting/recheck", json={"environment": "cuda-sm99"}, headers=write_headers)
    assert unknown.status_code == 422 and "cuda-sm80-fa2" in unknown.json()["error"]["valid"]


# --------------------------------------------------------------------------------------------
# Pages


def test_log_page_lists_entries_with_filters_and_one_click_retry(client, session, write_headers):
    run_id = fallback_run(client, write_headers, end=FAILED)
    csrf = login(client, session, ["read", "write"])
    page = soup(client.get("/troubleshooting?role=critic").text)
    rows = page.select("#entries li.trouble-entry")
    assert len(rows) == 1
    row = rows[0]
    assert row["data-category"] == "flash_attn_not_installed"
    assert row.select_one("a.run-link")["href"] == f"/runs/{run_id}"
    assert row.select_one(".role").get_text() == "critic"
    assert FA2_MISSING in row.select_one("details.original-error pre").get_text()
    assert row.select_one(".step .key").get_text() == "fall back to eager"
    form = row.select_one("form.retry-remedy")
    assert form["action"].endswith("/retry") and form.select_one("input[name=csrf_token]")["value"] == csrf
    assert row.select_one("code.patch").get_text() == f"{CRITIC_KEY}=eager"
    assert page.select_one("#filter-role option[selected]")["value"] == "critic"
    fragment = client.get("/troubleshooting?role=actor", headers={"HX-Request": "true"}).text
    assert soup(fragment).select_one("section#entries") is not None and "<html" not in fragment
    # the one-click retry: CSRF-checked, then the new run's page
    assert client.post(form["action"], data={"use": "remedy"}, follow_redirects=False).status_code == 403
    resp = client.post(form["action"], data={"use": "remedy", "csrf_token": csrf}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/runs/")


def test_a_remedys_retry_is_offered_on_a_failed_run_only(client, session, write_headers):
    """Issue 17 item 3 on the log: a run that succeeded after a fallback offers no "Retry with this remedy"
    (nothing failed; run_view.offers_retry, the run page's rule), its remedy's patch still said; the same
    fallback in a run that failed offers it, on the log, the entry's page and the run's fragment alike."""
    succeeded = fallback_run(client, write_headers, name="fell back, succeeded")
    failed = fallback_run(client, write_headers, name="fell back, failed", end=FAILED)
    login(client, session, ["read", "write"])
    rows = soup(client.get("/troubleshooting?role=critic").text).select("#entries li.trouble-entry")
    by_run = {int(row.select_one("a.run-link")["href"].rsplit("/", 1)[1]): row for row in rows}
    assert sorted(by_run) == sorted([succeeded, failed])
    for run_id, offered in ((succeeded, False), (failed, True)):
        entry_id = by_run[run_id]["data-entry"]
        for html in (str(by_run[run_id]), client.get(f"/troubleshooting/{entry_id}").text,
                     client.get(f"/runs/{run_id}/troubleshooting").text):
            page = soup(html)
            entry = page.select_one(f"li.trouble-entry[data-entry='{entry_id}']")
            buttons = [b.get_text() for b in entry.select("button")]
            assert ("Retry with this remedy" in buttons) is offered, (run_id, buttons)
            assert (entry.select_one("form.retry-remedy") is not None) is offered
            assert [c.get_text() for c in entry.select("code.patch")] == [f"{CRITIC_KEY}=eager"]
            no_retry = entry.select_one(".no-retry")
            assert (no_retry is None) is offered
            if not offered:
                assert no_retry.get_text() == "No retry: only a failed run is retried (this run: succeeded)."


def test_entry_page_notes_and_the_run_fragment(client, session, write_headers):
    run_id = fallback_run(client, write_headers)
    entry_id = entries(client, role="actor")["data"][0]["id"]
    csrf = login(client, session, ["read", "write"])
    page = client.get(f"/troubleshooting/{entry_id}").text
    assert csrf_of(page) == csrf
    resp = client.post(f"/troubleshooting/{entry_id}/notes", data={"text": "<b>checked</b> pip list", "csrf_token": csrf},
                       follow_redirects=False)
    assert resp.status_code == 303
    notes = soup(client.get(f"/troubleshooting/{entry_id}").text).select("#notes li.note p")
    assert [n.get_text() for n in notes] == ["<b>checked</b> pip list"]  # escaped, shown as text
    fragment = soup(client.get(f"/runs/{run_id}/troubleshooting").text)
    assert [li["data-entry"] for li in fragment.select("li.trouble-entry")] == [
        str(e["id"]) for e in entries(client, run_id=run_id)["data"]]
    assert fragment.select_one("a.run-link") is None  # compact: the run page knows its run


def test_fast_path_button_on_the_page(client, session, write_headers):
    fallback_run(client, write_headers)
    client.post("/api/troubleshooting/recheck", json={"environment": "cuda-sm80-fa2"}, headers=write_headers)
    login(client, session, ["read", "write"])
    page = soup(client.get("/troubleshooting").text)
    buttons = page.select("form.retry-fast-path button")
    assert len(buttons) == 2 and all(b.get_text() == "Return to flash_attention_2" for b in buttons)


def test_tracebacks_and_absolute_paths_only_to_signed_in_readers(client, write_headers, read_headers):
    run = make_run(client, write_headers)
    trace = ('Traceback (most recent call last):\n  File "/srv/attnboard/worker/engine/models.py", line 3, in load\n'
             "OSError: /srv/models/qwen/config.json is unreadable")
    post_events(client, write_headers, run["id"], [("status", {"status": "starting"}),
                                                   ("error", {"message": "OSError: unreadable", "traceback": trace})])
    anonymous = entries(client, run_id=run["id"])["data"][0]
    assert anonymous["error"] == "OSError: .../config.json is unreadable"
    assert "/srv" not in json.dumps(anonymous)
    signed = client.get("/api/troubleshooting", params={"run_id": run["id"]}, headers=read_headers).json()["data"][0]
    assert signed["error"] == trace
    page = client.get(f"/troubleshooting/{anonymous['id']}").text
    assert "/srv/attnboard" not in page
    # the run's events: the traceback's last line for anonymous readers, all of it for signed-in ones
    anonymous_events = client.get(f"/api/runs/{run['id']}/events").json()["data"]
    assert anonymous_events[1]["payload"]["traceback"] == "OSError: .../config.json is unreadable"
    signed_events = client.get(f"/api/runs/{run['id']}/events", headers=read_headers).json()["data"]
    assert signed_events[1]["payload"]["traceback"] == trace
