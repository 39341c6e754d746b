"""The dashboard's pages and fragments, checked by CSS selector on the parsed HTML."""

from __future__ import annotations

import json

import pytest

from app.run_form import FIELDS
from app.web import CONTENT_SECURITY_POLICY
from tests.app.pages_support import XSS_NAME, csrf_of, engine_events, login, soup, stored_run

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

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


# --------------------------------------------------------------------------------------------
# New-run form


def test_form_has_a_labelled_input_for_every_spec_field(client):
    page = soup(client.get("/runs/new").text)
    for f in FIELDS:
        control = page.select_one(f"#run-form [id='{f.input_id}']")
        assert control is not None, f.key
        assert control["name"] == f.key
        assert page.select_one(f"label[for='{f.input_id}']") is not None, f"{f.key} has no label"
    assert [legend.get_text(strip=True) for legend in page.select("#run-form legend")][:3] == [
        "Run", "Model", "Attention per role"]


def test_form_starts_from_a_spec_that_resolves(client):
    html = client.get("/runs/new").text
    assert set(preview_rows(html)) == {"actor", "rollout", "reference", "critic"}


def test_preview_shows_what_verls_rollout_engine_runs_apart(client):
    page = soup(client.get("/runs/new").text)
    rows = {tr["data-role"]: tr for tr in page.select("#preview table.resolution tbody tr")}
    rollout = rows["rollout"].select_one("td.under-verl")
    assert rollout.select_one("code").get_text(strip=True).startswith("vllm:")  # verl's default rollout engine
    assert "override_config does not reach it" in rollout.get_text(" ", strip=True)
    for role in ("actor", "reference", "critic"):  # what verl's training engine (model_engine=dp) reads for the role
        engine = rows[role].select_one("td.under-verl .verl-engine")
        assert engine["data-engine"] == "dp" and engine.select_one(".verl-effective") is not None
        assert engine.select_one("code.verl-key").get_text(strip=True).endswith(".override_config.attn_implementation")
    assert [th.get_text(strip=True) for th in page.select("#preview table.resolution thead th")][6] == "under verl"


@pytest.mark.parametrize(
    "strategy,expected_badge,expected_effective,rule",
    [
        ("fsdp_turbo", "forced", "eager", "forced-eager-fsdp-turbo-ulysses"),
        ("fsdp2", "override", "sdpa", "override"),
    ],
)
def test_preview_turbo_ulysses_forces_eager(client, strategy, expected_badge, expected_effective, rule):
    page = client.get("/runs/new").text
    data = form_data(page)
    data.update({
        "actor_rollout_ref.actor.strategy": strategy,
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": "2",
        "trainer.n_gpus_per_node": "2",
        "actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.model.use_remove_padding": "true",
    })
    resp = client.post("/runs/preview", data=data, headers={"HX-Request": "true", "X-CSRF-Token": csrf_of(page)})
    assert resp.status_code == 200, resp.text
    assert soup(resp.text).select_one("body") is None, "htmx gets the fragment, not the page"
    actor = preview_rows(resp.text)["actor"]
    assert (actor["requested"], actor["effective"], actor["badge"]) == ("sdpa", expected_effective, expected_badge)
    assert rule in actor["rules"]


def test_validation_error_is_shown_beside_its_field(client):
    page = client.get("/runs/new").text
    data = form_data(page) | {"actor_rollout_ref.actor.ppo_mini_batch_size": "-3", "csrf_token": csrf_of(page)}
    resp = client.post("/runs/preview", data=data)
    field = soup(resp.text).select_one("#f-actor-rollout-ref-actor-ppo-mini-batch-size").parent
    assert "has-error" in field["class"]
    assert field.select_one("p.error").get_text() == "'-3' is out of range: input should be greater than 0"
    assert not soup(resp.text).select("#preview table.resolution")


def test_import_fills_the_form_from_the_seed_critic_example(client):
    page = client.get("/runs/new").text
    resp = client.post("/runs/import", data={"verl_text": SEED_CRITIC_COMMAND, "csrf_token": csrf_of(page)},
                       headers={"HX-Request": "true"})
    assert resp.status_code == 200, resp.text
    form = soup(resp.text)
    for key in ("actor_rollout_ref.model.override_config.attn_implementation",
                "critic.model.override_config.attn_implementation"):
        assert form.select_one(f"select[name='{key}'] option[selected]")["value"] == "eager"
    assert form.select_one("#import-notes") is not None


def test_import_error_names_the_token(client):
    page = client.get("/runs/new").text
    resp = client.post("/runs/import", data={"verl_text": "python3 -m verl.trainer.main_ppo critic.optim.lr=abc",
                                             "csrf_token": csrf_of(page)})
    assert resp.status_code == 422
    assert "critic.optim.lr" in soup(resp.text).select_one("#import-errors").get_text()


def test_export_command_and_yaml_of_the_current_form(client):
    page = client.get("/runs/new").text
    data = form_data(page) | {"critic.model.override_config.attn_implementation": "sdpa", "name": "my run"}
    cmd = client.get("/runs/export/command", params=data, headers={"HX-Request": "true"})
    assert "+critic.model.override_config.attn_implementation=sdpa" in soup(cmd.text).select_one("#export-text").get_text()
    yml = client.get("/runs/export.yaml", params=data)
    assert yml.headers["content-disposition"] == 'attachment; filename="my-run.yaml"'
    assert "attn_implementation: sdpa" in yml.text


# --------------------------------------------------------------------------------------------
# Security: CSP, CSRF, auth, XSS


def test_every_page_has_the_csp_and_no_inline_script(client, session):
    run_id = stored_run(session, name="x", events=engine_events())
    for url in ("/", "/runs/new", "/login", f"/runs/{run_id}", f"/compare?ids={run_id}"):
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert resp.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        for script in soup(resp.text).select("script"):
            assert script.get("src", "").startswith("/static/") or script.get("type") == "application/json", url
        assert not soup(resp.text).select("[style]"), f"inline style on {url}"


def test_static_assets_are_served_locally(client):
    for path in ("/static/vendor/htmx.min.js", "/static/vendor/htmx-ext-sse.min.js", "/static/vendor/uPlot.iife.min.js",
                 "/static/app.js", "/static/app.css"):
        assert client.get(path).status_code == 200, path


def test_post_without_csrf_token_is_refused(client):
    resp = client.post("/runs/preview", data={"env": "cpu"}, headers={"Accept": "text/html"})
    assert resp.status_code == 403
    assert "CSRF token" in soup(resp.text).select_one(".error-message").get_text()


def test_session_cookie_flags_and_write_launches(client, session):
    _, = [None]
    csrf = login(client, session, ["read", "write"])
    cookie = next(c for c in client.cookies.jar if c.name == "attnboard_session")
    assert cookie.has_nonstandard_attr("HttpOnly")
    page = client.get("/runs/new").text
    resp = client.post("/runs", data=form_data(page) | {"name": "from the form"}, follow_redirects=False)
    assert resp.status_code == 303
    run_page = client.get(resp.headers["location"])
    assert soup(run_page.text).select_one("h1").get_text(" ", strip=True).startswith("from the form")
    assert csrf


A100_PROBE = {"rank": 0, "device": "cuda", "compute_capability": [8, 0], "gpu_name": "A100",
              "flash_attn_version": "2.8.3", "transformers_version": "5.24.0", "torch_version": "2.13.0",
              "kernels_installed": False, "cuda_version": "12.8", "hostname": "gpu-node-1"}


def test_the_newest_probed_worker_node_is_an_environment_of_the_form(client, session):
    """No run probed a node yet: no probe option, and ``env=probe`` is refused naming why. Once a run's rank 0
    sent its env_probe (an A100 with flash-attn here), the form offers it, the preview resolves for it
    (flash_attention_2 stays) and a launched run records the probe as its environment."""
    csrf = login(client, session, ["read", "write"])
    page = client.get("/runs/new").text
    assert soup(page).select_one("#f-env option[value=probe]") is None
    fa2 = {"actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2",
           "attnboard.fallback_policy": "fallback"}
    refused = client.post("/runs/preview", data=form_data(page) | fa2 | {"env": "probe"}, headers={"X-CSRF-Token": csrf})
    assert "(no worker node has been probed yet" in soup(refused.text).get_text()

    probed = stored_run(session, name="probed", events=[("status", {"status": "starting"}), ("env_probe", A100_PROBE)])
    stored_run(session, name="queued after it")  # newer, never started: the probe of the run before is used
    page = client.get("/runs/new").text
    option = soup(page).select_one("#f-env option[value=probe]")
    assert option is not None
    assert f"run #{probed}: cuda sm80 A100, flash-attn 2.8.3" in option.get_text()

    # The tiny CPU preset computes in fp32, which FlashAttention refuses (rule flash-attn-dtype); in bf16 it stays.
    bf16 = dict.fromkeys(("actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.ref.fsdp_config.dtype",
                          "actor_rollout_ref.rollout.dtype", "critic.fsdp.dtype"), "bf16")
    for env, dtypes, effective in (("cpu", bf16, "sdpa"), ("probe", {}, "sdpa"), ("probe", bf16, "flash_attention_2")):
        resp = client.post("/runs/preview", data=form_data(page) | fa2 | dtypes | {"env": env},
                           headers={"X-CSRF-Token": csrf})
        assert resp.status_code == 200, resp.text
        actor = preview_rows(resp.text)["actor"]
        assert actor["effective"] == effective, env
        assert ("flash-attn-dtype" in actor["rules"]) == (env == "probe" and not dtypes)
    fa2 |= bf16

    resp = client.post("/runs", data=form_data(page) | fa2 | {"env": "probe", "name": "on the probed node"},
                       follow_redirects=False)
    assert resp.status_code == 303, resp.text
    run_id = int(resp.headers["location"].rsplit("/", 1)[1])
    environment = client.get(f"/api/runs/{run_id}").json()["environment"]
    assert environment["name"] == f"probe of run #{probed}"
    assert (environment["device"], environment["flash_attn_version"]) == ("cuda", "2.8.3")


def test_read_only_session_cannot_launch(client, session):
    login(client, session, ["read"])
    page = client.get("/runs/new").text
    assert soup(page).select_one("#run-form button.primary").has_attr("disabled")
    resp = client.post("/runs", data=form_data(page), headers={"Accept": "text/html"})
    assert resp.status_code == 403


def test_anonymous_launch_goes_to_login(client):
    page = client.get("/runs/new").text
    resp = client.post("/runs", data=form_data(page), follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/login")


def test_cookie_without_csrf_header_is_no_principal_for_the_api(client, session):
    login(client, session, ["read", "write"])
    resp = client.post("/api/runs", json={"spec": {}})
    assert resp.status_code == 401


def test_bad_token_login_is_refused(client):
    page = client.get("/login").text
    resp = client.post("/login", data={"token": "atb_nope", "csrf_token": csrf_of(page)})
    assert resp.status_code == 401
    assert soup(resp.text).select_one("#token-err").get_text() == "unknown or revoked token"


def test_xss_run_name_renders_as_text(client, session):
    run_id = stored_run(session, name=XSS_NAME, events=engine_events())
    for url in ("/", f"/runs/{run_id}", f"/compare?ids={run_id}"):
        page = soup(client.get(url).text)
        assert not page.select("img[onerror]"), url
        assert all(s.get("src") or s.get("type") == "application/json" for s in page.select("script")), url
        assert all("<" not in (s.string or "") for s in page.select("script[type='application/json']")), url
        assert XSS_NAME in page.get_text(), url


# --------------------------------------------------------------------------------------------
# Runs list, live page, stream, compare


def role_badges_of(row) -> dict[str, tuple[str, str]]:
    """Per role in a runs-list row: (the badge's data, the text it shows)."""
    return {span["data-role"]: (span["data-badge"], span.get_text(" ", strip=True)) for span in row.select(".role-badge")}


def test_list_shows_status_and_effective_attention(client, session):
    run_id = stored_run(session, name="listed", events=engine_events())
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    assert row.select_one(".badge-succeeded").get_text(strip=True).endswith("succeeded")
    assert role_badges_of(row)["actor"] == ("override", "actor sdpa override")
    fragment = client.get("/", params={"status": "failed"}, headers={"HX-Request": "true"}).text
    assert not soup(fragment).select(f"tr[data-run='{run_id}']")


@pytest.mark.parametrize("run,critic,roles", [
    ("critic_fallback", ("fallback", "critic flash_attention_2 → sdpa ↓ fallback"),
     ["actor", "rollout", "reference", "critic"]),
    ("critic_strict", ("error", "critic flash_attention_2 → none ✕ error"), ["critic"]),  # stopped before any report
])
def test_list_shows_a_critic_that_fell_back_or_failed_as_such(client, session, run, critic, roles):
    """Not "ok": the badge says what happened, in colour (its class) and in words."""
    csrf = login(client, session, ["read", "write"])
    run_id = stored_run(session, name=run, events=engine_events(run))
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    badges = role_badges_of(row)
    assert badges["critic"] == critic
    assert row.select_one(f".role-badge[data-role='critic'] .badge-{critic[0]}") is not None
    assert list(badges) == roles
    retry = row.select_one("td.quick form input[name='eager_on'][value='critic']").parent
    assert retry["action"] == f"/runs/{run_id}/retry" and retry.select_one("input[name='csrf_token']")["value"] == csrf


def test_list_quick_links_need_write(client, session):
    run_id = stored_run(session, name="anyone", events=engine_events("critic_fallback"))
    login(client, session, ["read"])
    row = soup(client.get("/").text).select_one(f"tr[data-run='{run_id}']")
    assert row.select("td.quick form") == []


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


def test_compare_shows_differences_and_one_reward_chart(client, session):
    a = stored_run(session, name="a", events=engine_events(steps=3))
    b = stored_run(session, name="b", events=engine_events(steps=2), **{"actor_rollout_ref.actor.clip_ratio": 0.3})
    page = soup(client.get("/compare", params={"ids": f"{a},{b}"}).text)
    diff_keys = [th.get_text(strip=True) for th in page.select("table.diffs tbody th")]
    assert diff_keys == ["actor_rollout_ref.actor.clip_ratio"]
    assert len(page.select("table.compare tbody tr")) == 2
    assert '"x":[1,2,3]' in page.select_one("#reward-data").string
    critic = page.select_one(f"table.compare tr[data-run='{a}'] .role-badge[data-role='critic']")
    assert critic["data-badge"] == "override"
    assert page.select_one(f"table.compare tr[data-run='{a}'] td.num").get_text() != "—"


def test_compare_takes_the_lists_checkboxes(client, session):
    a = stored_run(session, name="a", events=engine_events())
    b = stored_run(session, name="b", events=engine_events("critic_fallback"))
    page = soup(client.get(f"/compare?ids={a}&ids={b}").text)
    assert [tr["data-run"] for tr in page.select("table.compare tbody tr")] == [str(a), str(b)]


# --------------------------------------------------------------------------------------------
# verl keys attnboard does not model: kept, shown, launched with, listed on the run page (issue 10, 12)

SCRIPT = """set -x
MODEL=${MODEL:-builtin:tiny-llama}
python3 -m verl.trainer.main_ppo \\
    data.train_files=builtin:count \\
    data.val_files=$HOME/data/test.parquet \\
    data.train_batch_size=4 \\
    actor_rollout_ref.model.path=$MODEL \\
    critic.model.path=$MODEL \\
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \\
    +reward_model.reward_kwargs.max_resp_len=512 \\
    trainer.logger='["console","wandb"]' \\
    trainer.device=cpu trainer.n_gpus_per_node=1 trainer.total_training_steps=1 $@ 2>&1 | tee run.log
"""
PASSED_KEYS = {"data.val_files": "$HOME/data/test.parquet", "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4,
               "+reward_model.reward_kwargs.max_resp_len": 512, "trainer.logger": ["console", "wandb"]}


def _passthrough_rows(html: str) -> dict[str, object]:
    rows = soup(html).select("#passthrough table.passthrough-keys tr")
    return {r.select_one("th").get_text(strip=True): json.loads(r.select_one("td").get_text(strip=True)) for r in rows}


def test_imported_pass_through_keys_are_shown_launched_and_listed(client, session):
    csrf = login(client, session, ["read", "write"])
    resp = client.post("/runs/import", data={"verl_text": SCRIPT, "csrf_token": csrf}, headers={"HX-Request": "true"})
    assert resp.status_code == 200, resp.text
    form = soup(resp.text)
    notes = form.select_one("#import-notes").get_text(" ", strip=True)
    assert "passed through to verl, not run by attnboard: data.val_files" in notes
    assert "from the environment, kept verbatim: HOME" in notes
    assert form.select_one("textarea[name='verl_passthrough']").get_text().startswith("data.val_files: $HOME/data/")
    assert _passthrough_rows(resp.text) == PASSED_KEYS
    data = form_data(resp.text) | {"name": "with pass-through", "csrf_token": csrf}
    preview = client.post("/runs/preview", data=data, headers={"HX-Request": "true"})
    assert _passthrough_rows(preview.text) == PASSED_KEYS
    launched = client.post("/runs", data=data, follow_redirects=False)
    assert launched.status_code == 303, launched.text
    run_page = client.get(launched.headers["location"])
    assert _passthrough_rows(run_page.text) == PASSED_KEYS
    heading = soup(run_page.text).select_one("#passthrough h3").get_text(" ", strip=True)
    assert heading == "Passed through to verl, not run by attnboard (4)"
    run_id = int(launched.headers["location"].rsplit("/", 1)[1])
    detail = client.get(f"/api/runs/{run_id}").json()
    assert detail["spec"]["verl_passthrough"] == PASSED_KEYS
    exported = client.get(f"/api/runs/{run_id}/export", params={"format": "cli"}).json()["text"]
    assert "    +reward_model.reward_kwargs.max_resp_len=512 \\" in exported.splitlines()


def test_a_launch_refuses_what_the_engine_does_not_run(client, write_headers):
    spec = {"algorithm.adv_estimator": "rloo", "actor_rollout_ref.rollout.n": 2}
    resp = client.post("/api/runs", json={"spec": spec}, headers=write_headers)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["field"] == "spec.algorithm.adv_estimator"
    assert "attnboard's engine does not run adv_estimator rloo (verl does); it runs gae, grpo" in error["message"]
    saved = client.post("/api/specs", json={"name": "rloo", "spec": spec}, headers=write_headers)
    assert saved.status_code == 201  # a spec may hold it (preview, import and export accept it)


VEOMNI_SCRIPT = """python3 -m verl.trainer.main_ppo model_engine=veomni algorithm.adv_estimator=gae \\
    actor_rollout_ref.model.path=builtin:tiny-qwen2 critic.model.path=builtin:tiny-qwen2 \\
    actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2 critic.veomni.attn_implementation=sdpa \\
    +actor_rollout_ref.model.override_config.attn_implementation=eager \\
    +critic.model.override_config.attn_implementation=eager \\
    trainer.device=cpu trainer.n_gpus_per_node=1 trainer.total_training_steps=1 data.train_batch_size=4 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=2 data.train_files=builtin:count
"""


def test_a_veomni_script_shows_its_engine_on_the_form_the_preview_and_the_run_page(client, session):
    csrf = login(client, session, ["read", "write"])
    resp = client.post("/runs/import", data={"verl_text": VEOMNI_SCRIPT, "csrf_token": csrf},
                       headers={"HX-Request": "true"})
    assert resp.status_code == 200, resp.text
    form = soup(resp.text)
    assert form.select_one("select[name='model_engine'] option[selected]")["value"] == "veomni"
    data = form_data(resp.text) | {"name": "veomni", "csrf_token": csrf}
    preview = soup(client.post("/runs/preview", data=data, headers={"HX-Request": "true"}).text)
    rows = {tr["data-role"]: tr for tr in preview.select("#preview table.resolution tbody tr")}
    actor = rows["actor"].select_one("td.under-verl .verl-engine")
    assert actor["data-engine"] == "veomni"
    assert actor.select_one("code.verl-key").get_text(strip=True) == "actor_rollout_ref.actor.veomni.attn_implementation"
    assert "verl-engine-rewrite" in [li["data-rule"] for li in actor.select("li")]
    critic = rows["critic"].select_one("td.under-verl .verl-engine")
    assert critic.select_one("code.verl-key").get_text(strip=True) == "critic.veomni.attn_implementation"
    assert "attnboard-runs-dp" in [li["data-rule"] for li in critic.select("li")]
    launched = client.post("/runs", data=data, follow_redirects=False)
    assert launched.status_code == 303, launched.text
    page = soup(client.get(launched.headers["location"]).text)
    assert page.select_one("p.model-engine")["data-engine"] == "veomni"
