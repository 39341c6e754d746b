"""Issue 18's attacks, each against a real ``attnboard serve`` (a subprocess on loopback, its own data folder and
embedded Ray), with the fix asserted: a pathological import neither freezes the server nor outlives its wall
clock, a write token cannot forge a run's events and a real run's events are all stored, paths outside the
allowed folders are refused at submit naming the key with no existence oracle, and the rest of the list
(foreign Host, YAML tags, NUL filters, unknown keys, sign-ins, logout, token minting)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.app.pages_support import csrf_of
from tests.app.service_support import AppProcess, all_events, app_env, tiny_run_spec, wait_until

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

FORTY = "a" * 39 + "!"
PATHOLOGICAL = {  # issue 18 item 1: each form on 40 characters
    "regex": f"X={FORTY}\nif [[ $X =~ ^(a+)+$ ]]; then echo y; fi\n",
    "case": f"X={'a' * 40}\ncase $X in *a*a*a*a*a*a*a*a*a*a*ab) echo y;; esac\n",
    "substitution": f"X={'a' * 40}\nY=${{X//*b/c}}\n",
}
VERL = "python3 -m verl.trainer.main_ppo trainer.device=cpu data.train_batch_size=4\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AppProcess, dict[str, dict[str, str]]]]:
    import os

    from sqlmodel import Session

    from app.db import make_engine
    from app.services.tokens import create_token

    base = tmp_path_factory.mktemp("attacked")
    env = app_env({**os.environ, "XDG_CONFIG_HOME": str(base / "config"), "ATTNBOARD_WARM_RANKS": "0"},
                  data_dir=base / "data", num_cpus=2)
    app = AppProcess(env, base / "app.log").start()
    engine = make_engine(f"sqlite:///{base / 'data' / 'attnboard.db'}")
    headers = {}
    with Session(engine) as session:
        for name, scopes in {"read": ["read"], "write": ["read", "write"], "admin": ["admin", "read", "write"]}.items():
            _, secret = create_token(session, name=f"attack-{name}", scopes=scopes)  # type: ignore[arg-type]
            headers[name] = {"Authorization": f"Bearer {secret}"}
    engine.dispose()
    yield app, headers
    app.stop()


def _timed_with_health(url: str, call) -> tuple[httpx.Response, float, list[float]]:
    """Run ``call`` while another client asks /api/health every 20 ms; the call's answer, its time, and the
    health latencies seen meanwhile."""
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=10) as health:
            while not done.is_set():
                t0 = time.perf_counter()
                assert health.get("/api/health").status_code == 200
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.02)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.1)
    t0 = time.perf_counter()
    try:
        resp = call()
    finally:
        elapsed = time.perf_counter() - t0
        time.sleep(0.1)
        done.set()
        thread.join()
    return resp, elapsed, latencies


@pytest.mark.parametrize("form", sorted(PATHOLOGICAL))
def test_a_pathological_import_neither_freezes_the_server_nor_outlives_its_clock(server, form):
    app, headers = server
    with httpx.Client(base_url=app.url, headers=headers["read"], timeout=180) as http:
        # The wall clock counts the parse, not a child's start: wait until the import children (started with the
        # server, or replacing one the previous case killed) answer a plain import.
        assert http.post("/api/import", json={"text": VERL}).status_code == 200
        resp, elapsed, latencies = _timed_with_health(
            app.url, lambda: http.post("/api/import", json={"text": PATHOLOGICAL[form] + VERL}))
    assert elapsed < 2.0, (form, elapsed, resp.text[:300])
    assert resp.status_code < 500, resp.text[:300]
    if resp.status_code >= 400:
        assert resp.json()["error"]["field"] == "text"
    # The server answers health in under 100 ms while the import runs (it froze 9.5 s before); on this shared
    # 2-core test machine (load often above 10) the scheduler may delay a single poll, so 90% must be under 100 ms
    # and none may take 0.5 s.
    slow = sorted(latencies)
    assert len(slow) >= 5 and slow[int(len(slow) * 0.9) - 1] < 0.1 and slow[-1] < 0.5, (form, slow[-5:])


def test_the_forms_import_needs_a_signed_in_user(server):
    app, _ = server
    with httpx.Client(base_url=app.url, timeout=30) as browser:
        csrf = csrf_of(browser.get("/login").text)  # the pre-session CSRF cookie anyone gets
        resp = browser.post("/runs/import", data={"verl_text": PATHOLOGICAL["regex"] + VERL, "csrf_token": csrf},
                            headers={"HX-Request": "true"})
    assert resp.status_code == 401 and "sign in to import" in resp.text


def test_a_forged_event_is_refused_and_the_real_events_are_all_stored(server):
    app, headers = server
    with httpx.Client(base_url=app.url, headers=headers["write"], timeout=60) as http:
        run = http.post("/api/runs", json={"name": "attacked", "spec": tiny_run_spec(steps=2)}).json()
        forged = [{"seq": 1, "kind": "status", "payload": {"status": "succeeded"}},
                  {"seq": 2, "kind": "attention", "payload": {"role": "actor", "effective": "flash_attention_2"}}]
        refused = http.post(f"/api/runs/{run['id']}/events", json=forged)
        assert refused.status_code == 403 and refused.json()["error"]["field"] == "X-Attnboard-Ingest"
        admin = http.post(f"/api/runs/{run['id']}/events", json=forged, headers=headers["admin"])
        assert admin.status_code == 403
        done = wait_until(http, run["id"], lambda r: r["status"] in ("succeeded", "failed", "cancelled"),
                          timeout=600, what="the end of the run")
        assert done["status"] == "succeeded", done["status_reason"]
        events = all_events(http, run["id"])
    assert [e["seq"] for e in events] == list(range(1, done["last_seq"] + 1))
    assert sum(e["kind"] == "metric" for e in events) == 2  # every real step stored
    assert not any(e["payload"].get("effective") == "flash_attention_2" for e in events if e["kind"] == "attention")


@pytest.mark.parametrize("key,value", [("data.train_files", "/etc/shadow"), ("data.train_files", "/proc/self/environ"),
                                       ("data.train_files", "../../../../etc/passwd"),
                                       ("actor_rollout_ref.model.path", "/etc"),
                                       ("trainer.default_local_dir", "../7/checkpoints")])
def test_paths_outside_the_allowed_folders_are_refused_at_submit(server, key, value):
    app, headers = server
    with httpx.Client(base_url=app.url, headers=headers["write"], timeout=30) as http:
        resp = http.post("/api/runs", json={"spec": tiny_run_spec(**{key: value})})
        assert resp.status_code == 422 and resp.json()["error"]["field"] == f"spec.{key}", resp.text
        issues = http.post("/api/resolve", json={"spec": tiny_run_spec(**{key: value})}).json()["issues"]
        assert f"spec.{key}" in [i["field"] for i in issues]


def test_no_existence_oracle(server):
    app, headers = server
    answers = []
    with httpx.Client(base_url=app.url, headers=headers["write"], timeout=30) as http:
        for path in ("/etc/shadow", "/etc/no-such-file-here"):
            error = http.post("/api/runs", json={"spec": tiny_run_spec(**{"data.train_files": path})}).json()["error"]
            answers.append(json.dumps(error).replace(path, "PATH"))
    assert answers[0] == answers[1]


def test_the_rest_of_the_list(server):
    app, headers = server
    with httpx.Client(base_url=app.url, timeout=30) as http:
        # a page on another domain rebound to 127.0.0.1
        assert http.get("/api/runs", headers={"Host": "attacker.example"}).status_code == 400
        # YAML tags and NUL in a filter: 422, not 500
        tagged = http.post("/api/import", json={"text": "a: !!python/object/apply:os.system ['id']"},
                           headers=headers["read"])
        assert tagged.status_code == 422 and tagged.json()["error"]["code"] == "invalid_yaml"
        assert http.get("/?q=%00").status_code == 422 and http.get("/api/runs?name=a%00").status_code == 422
        # 5,000 unknown keys cost a bounded time
        t0 = time.perf_counter()
        many = http.post("/api/resolve", json={"spec": {f"trainer.bogus_{i}": 1 for i in range(5000)}},
                         headers=headers["read"])
        assert many.status_code < 500 and time.perf_counter() - t0 < 2.0
        # a write token mints no tokens and revokes none
        assert http.post("/api/tokens", json={"name": "more", "scopes": ["admin"]}, headers=headers["write"]).status_code == 403
        assert http.post("/api/tokens", json={"name": "ci", "scopes": ["read"]}, headers=headers["admin"]).status_code == 201


def test_sign_ins_are_limited_and_logout_ends_the_session(server):
    app, headers = server
    token = headers["write"]["Authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=app.url, timeout=30) as browser:
        csrf = csrf_of(browser.get("/login").text)
        assert browser.post("/login", data={"token": token, "csrf_token": csrf, "next": "/"}).status_code == 303
        cookie = browser.cookies.get("attnboard_session")
        page_csrf = csrf_of(browser.get("/runs/new").text)
        assert browser.post("/logout", data={"csrf_token": page_csrf}).status_code == 303
    with httpx.Client(base_url=app.url, timeout=30, cookies={"attnboard_session": cookie}) as replay:
        preview = replay.post("/runs/preview", data={"csrf_token": page_csrf}, headers={"HX-Request": "true"})
        assert "Sign in to see" in preview.text  # the replayed cookie signs no one in
    with httpx.Client(base_url=app.url, timeout=30) as guesser:
        csrf = csrf_of(guesser.get("/login").text)
        codes = [guesser.post("/login", data={"token": f"atb_guess{i}", "csrf_token": csrf}).status_code
                 for i in range(12)]
        assert codes[:10] == [401] * 10 and codes[10:] == [429, 429]
        assert int(guesser.post("/login", data={"token": "atb_x", "csrf_token": csrf}).headers["retry-after"]) >= 1


def test_the_setting_names_in_the_security_section_are_settings():
    """README's "Security model" names only settings of the settings table."""
    import re

    from app.core.config import ENV_PREFIX, Settings

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Security model", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"ATTNBOARD_([A-Z_]+)", section))
    assert named and named <= set(Settings.model_fields), named - set(Settings.model_fields)
    assert ENV_PREFIX == "ATTNBOARD_"
