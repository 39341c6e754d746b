"""The one attention payload reaches the user whole: every field of ``AttentionPayload`` (walked, each with a
value of its own) is on the run page and in ``/wait``; the events the app writes itself follow the contract."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from app.services.pump import gone_events
from tests.app.pages_support import soup, stored_run
from worker.core.attention_payload import FIELDS, AttentionPayload
from worker.core.events import validate_payload


def _value(name: str, hint: str, n: int) -> Any:
    """A value of the field's type that no other field has."""
    if hint.startswith("bool"):
        return True  # every boolean defaults to False
    if hint.startswith("int"):
        return 100 + n
    if hint.startswith("dict[str, int]"):
        return {f"{name}-kernel": 200 + n}
    if hint.startswith("dict"):
        return {"detail": f"{name}-detail"}
    if hint.startswith("list"):
        return [{"rule": f"{name}-rule", "text": f"{name}-text", "op": f"{name}-op", "backend": f"{name}-backend"}]
    return f"{name}-value"


def every_field() -> dict[str, Any]:
    hints = {f.name: str(AttentionPayload.__annotations__[f.name]) for f in fields(AttentionPayload)}
    payload = {name: _value(name, hints[name], i) for i, name in enumerate(FIELDS)}
    payload["role"] = "critic"
    assert AttentionPayload(**payload).as_dict() == payload and validate_payload("attention", payload)
    return payload


def test_every_attention_field_reaches_the_run_page_and_wait(client, session):
    payload = every_field()
    statuses = [("status", {"status": state, "state": state}) for state in ("starting", "running")]
    run_id = stored_run(session, name="fields", events=[*statuses, ("attention", payload),
                                                        ("status", {"status": "succeeded", "state": "succeeded"})])
    page = soup(client.get(f"/runs/{run_id}").text)
    row = page.select_one("tr[data-role='critic']")
    assert row is not None
    shown = {dd["data-field"]: json.loads(dd.get_text()) for dd in row.select("dd[data-field]")}
    assert shown == payload
    answer = client.get(f"/api/runs/{run_id}/wait", params={"timeout": 0}).json()
    (critic,) = [row for row in answer["attention"] if row["role"] == "critic"]
    assert {k: v for k, v in critic.items() if k in payload} == payload


def test_the_events_the_app_writes_follow_the_contract():
    for event in gone_events(7, name="host", why="is gone", cancel_requested=False):
        validate_payload(event.kind, event.payload)
