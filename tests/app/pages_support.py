"""Helpers for the dashboard tests: parse HTML, log a browser in, store a run with events."""

from __future__ import annotations

from typing import Any

from bs4 import BeautifulSoup
from sqlmodel import Session

from app.models import EventCreate, RunCreate
from app.services.events import append_events
from app.services.runs import create_run
from app.services.tokens import create_token
from tests.app.factories import tiny_spec

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


def succeeded_events(steps: int = 3, *, fallback_critic: bool = False) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = [
        ("status", {"status": "starting"}),
        ("env_probe", {"device": "cpu", "torch": "2.13.0", "transformers": "5.24.0", "flash_attn": None}),
        ("status", {"status": "running"}),
        ("attention", {"role": "actor", "rank": 0, "requested": "sdpa", "effective": "sdpa", "observed": "sdpa",
                       "status": "ok", "forced": False, "reasons": [{"rule": "override", "text": "requested sdpa"}]}),
    ]
    if fallback_critic:
        events += [
            ("fallback", {"role": "critic", "from": "flash_attention_2", "to": "sdpa",
                          "message": "FlashAttention2 has been toggled on, but it cannot be used"}),
            ("attention", {"role": "critic", "rank": 0, "requested": "flash_attention_2", "effective": "sdpa",
                           "observed": "sdpa", "status": "fallback", "forced": False,
                           "reasons": [{"rule": "fallback-step", "text": "flash_attention_2 -> sdpa"}]}),
        ]
    for step in range(1, steps + 1):
        events.append(("metric", {"step": step, "values": {"reward/mean": 0.1 * step, "actor/kl": 0.01 * step,
                                                           "actor/pg_loss": 1.0 / step, "perf/tokens_per_s": 100.0 + step,
                                                           "perf/peak_memory_mb": 50.0, "perf/step_time": 0.5}}))
    events.append(("status", {"status": "succeeded"}))
    return events
