"""Helpers for the dashboard tests: parse HTML, log a browser in, store a run with events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bs4 import BeautifulSoup
from sqlmodel import Session

from app.models import EventCreate, RunCreate
from app.services.events import append_events
from app.services.pump import to_event_create
from app.services.runs import create_run
from app.services.tokens import create_token
from tests.app.factories import tiny_spec

ENGINE_EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_events.json"
XSS_NAME = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def soup(html: str) -> BeautifulSoup:
    return BeautifulSoup(html, "html.parser")


def csrf_of(html: str) -> str:
    body = soup(html).select_one("input[name=csrf_token]")
    assert body is not None, "no CSRF field on the page"
    return str(body["value"])


def login(client, session: Session, scopes: list[str]) -> str:
    """Log the TestClient in with a new token; returns the session's CSRF token."""
    _, token = create_token(session, name="browser-" + "-".join(scopes), scopes=scopes)  # type: ignore[arg-type]
    page = client.get("/login")
    resp = client.post("/login", data={"token": token, "csrf_token": csrf_of(page.text), "next": "/"},
                       follow_redirects=False)
    assert resp.status_code == 303, resp.text
    return csrf_of(client.get("/runs/new").text)


def stored_run(session: Session, *, name: str = "run", events: list[tuple[str, dict[str, Any]]] = (),
               **spec: Any) -> int:
    """A run inserted through the services, with ``events`` (kind, payload) appended from seq 1."""
    run = create_run(session, data=RunCreate(name=name, spec=tiny_spec(**spec)))
    if events:
        append_events(session, run_id=run.id, events=[EventCreate(seq=i + 1, kind=kind, payload=payload)
                                                      for i, (kind, payload) in enumerate(events)])
    return run.id


def engine_events(run: str = "succeeded", *, steps: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The events ``(kind, payload)`` of a real engine run as the pump stores them
    (``to_event_create``). Runs captured by ``tests/fixtures/capture_engine_events.py`` (2 ranks,
    2 steps): ``succeeded`` (sdpa everywhere), ``critic_fallback`` (flash_attention_2 on the critic
    falls back to sdpa), ``critic_strict`` (the same under strict: the run fails).

    ``steps`` stretches the run to that many steps by repeating its real metric payloads (step and
    total_steps renumbered), for charts and progress with more points.
    """
    captured = json.loads(ENGINE_EVENTS.read_text())[run]
    metrics = [e for e in captured if e["kind"] == "metric"]
    if steps is not None:
        if not metrics:
            raise ValueError(f"run {run!r} has no metric events to repeat; runs with metrics: succeeded, critic_fallback")
        first = captured.index(metrics[0])
        tail = [e for e in captured[first:] if e["kind"] != "metric"]
        stretched = [{**metrics[i % len(metrics)],
                      "payload": {**metrics[i % len(metrics)]["payload"], "step": i + 1, "total_steps": steps}}
                     for i in range(steps)]
        captured = [_with_total(e, steps) for e in captured[:first]] + stretched + tail
    out = []
    for seq, event in enumerate(captured, start=1):
        stored = to_event_create({**event, "seq": seq})
        out.append((stored.kind.value, stored.payload))
    return out


def _with_total(event: dict[str, Any], steps: int) -> dict[str, Any]:
    payload = event["payload"]
    if event["kind"] == "status" and "total_steps" in payload:
        return {**event, "payload": {**payload, "total_steps": steps}}
    return event


SEED_CRITIC_COMMAND = """python3 ppo_trainer.py \\
    actor_rollout_ref.model.override_config.attn_implementation=eager \\
    critic.model.override_config.attn_implementation=eager \\
    [other parameters...]"""



def preview_rows(html: str) -> dict[str, dict[str, str]]:
    rows = {}
    for tr in soup(html).select("#preview table.resolution tbody tr"):
        rows[tr["data-role"]] = {
            "requested": tr.select_one("td.requested").get_text(strip=True),
            "effective": tr.select_one("td.effective").get_text(strip=True),
            "badge": tr.select_one("td.status .badge").get_text(" ", strip=True).split()[-1],
            "rules": " ".join(li["data-rule"] for li in tr.select("td.reasons li")),
        }
    return rows



def form_data(html: str) -> dict[str, str]:
    """What a browser would submit for the run form as rendered (last value wins, as the app reads it)."""
    page = soup(html)
    data: dict[str, str] = {}
    for el in page.select("#run-form input, #run-form select, #run-form textarea"):
        name = el.get("name")
        if not name:
            continue
        if el.name == "textarea":
            data[name] = el.get_text()
        elif el.name == "select":
            chosen = el.select_one("option[selected]") or el.select_one("option")
            data[name] = chosen["value"] if chosen else ""
        elif el.get("type") == "checkbox":
            if el.has_attr("checked"):
                data[name] = el["value"]
        else:
            data[name] = el.get("value", "")
    return data



def parse_sse(text: str) -> list[dict[str, str]]:
    messages = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(": ")
            fields[key] = fields[key] + "\n" + value if key in fields and key == "data" else value
        if "event" in fields:
            messages.append(fields)
    return messages

