"""One preview path: the new-run form's preview fragment, ``POST /api/resolve`` and ``attnboard resolve``
all run ``worker.attention.preview.preview`` with the same model information (the head counts of the
model's config.json), so the same spec on the same environment shows the same roles, statuses, reasons
and issues in all three."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.views.run_form import form_to_spec_data
from tests.app.factories import HEADS_ERRORS, sp4_spec
from tests.app.pages_support import csrf_of, form_data, soup
from tests.app.test_cli import run

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

Roles = dict[str, tuple[str, list[tuple[str, str]]]]
Issues = list[tuple[str, str, str]]


def form_preview(html: str) -> tuple[Roles, Issues]:
    """The preview fragment as parsed: per role (status, [(rule, text)]) and every issue (field, severity, message)."""
    page = soup(html)
    roles: Roles = {}
    for tr in page.select("#preview table.resolution tbody tr"):
        reasons = []
        for li in tr.select("td.reasons li"):
            li.select_one("span.rule").extract()
            reasons.append((li["data-rule"], li.get_text(strip=True)))
        roles[tr["data-role"]] = (tr["data-status"], reasons)
    issues = [(el["data-field"], el["data-severity"], el.select_one(".message").get_text(strip=True))
              for el in page.select("#preview .issue")]
    return roles, sorted(issues)


def json_preview(resolution: dict[str, Any], issues: list[dict[str, Any]], prefix: str = "") -> tuple[Roles, Issues]:
    roles = {name: (r["status"], [(x["rule"], x["text"].strip()) for x in r["reasons"]])
             for name, r in resolution["roles"].items()}
    return roles, sorted((i["field"].removeprefix(prefix), i["severity"], i["message"].strip()) for i in issues)


@pytest.mark.parametrize("env", ["cuda-sm90-fa2", "cpu"])
def test_form_api_and_cli_preview_a_spec_alike(tmp_path, make_client, session, env):
    from tests.conftest import _token_headers

    model, asked = sp4_spec(tmp_path)
    client = make_client(MODEL_ROOTS=[model.parent])
    from tests.app.pages_support import login

    login(client, session, ["read"])  # the form's preview parses what was typed: a signed-in user
    page = client.get("/runs/new").text
    data = form_data(page) | {key: str(value) for key, value in asked.items()} | {"env": env}
    spec = form_to_spec_data({key: [value] for key, value in data.items()})

    resp = client.post("/runs/preview", data=data | {"csrf_token": csrf_of(page)}, headers={"HX-Request": "true"})
    assert resp.status_code == 200
    form = form_preview(resp.text)

    body = client.post("/api/resolve", json={"spec": spec, "environment": env},
                       headers=_token_headers(session, ["read"])).json()
    api = json_preview(body["resolution"], body["issues"], prefix="spec.")

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    proc = run("resolve", str(spec_file), "--env", env, "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the head-count errors
    out = json.loads(proc.stdout)
    cli = json_preview(out, out["issues"])

    assert form == api == cli
    roles, issues = form
    assert set(roles) >= {"actor", "rollout", "reference"}
    assert [m for _, severity, m in issues if m in HEADS_ERRORS] == sorted(HEADS_ERRORS)  # the form shows them
    assert all(severity == "error" for _, severity, m in issues if m in HEADS_ERRORS)


def test_the_form_refuses_to_launch_what_the_preview_flags(tmp_path, make_client, session):
    """The head-count errors are the form's own: a launch of that spec answers 422 with them beside the input."""
    from tests.app.pages_support import login

    model, asked = sp4_spec(tmp_path)
    client = make_client(MODEL_ROOTS=[model.parent])
    csrf = login(client, session, ["read", "write"])
    page = client.get("/runs/new").text
    data = form_data(page) | {key: str(value) for key, value in asked.items()} | {"env": "cuda-sm90-fa2"}
    resp = client.post("/runs", data=data | {"csrf_token": csrf})
    assert resp.status_code == 422
    beside = soup(resp.text).select_one("#f-actor-rollout-ref-actor-fsdp-config-ulysses-sequence-parallel-size-err")
    assert beside is not None
    assert [m for m in HEADS_ERRORS if m in beside.get_text()] == HEADS_ERRORS
