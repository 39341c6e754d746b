"""The new-run page: the form, its preview fragment, verl import and export, the launch."""

from __future__ import annotations

import json

import pytest

from app.views.run_form import FIELDS
from tests.app.pages_support import (
    SEED_CRITIC_COMMAND,
    csrf_of,
    form_data,
    login,
    preview_rows,
    soup,
    stored_run,
)
from worker.interop.verl import MAX_INPUT_BYTES

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def signed_in(client, session):
    """The form's preview, import and launch parse what a user typed: they need a signed-in user (issue 18;
    anonymous, see ``tests/app/routes/test_login.py``)."""
    login(client, session, ["read", "write"])


def test_form_has_a_labelled_input_for_every_spec_field(client):
    page = soup(client.get("/runs/new").text)
    for f in FIELDS:
        control = page.select_one(f"#run-form [id='{f.input_id}']")
        assert control is not None, f.key
        assert control["name"] == f.key
        assert page.select_one(f"label[for='{f.input_id}']") is not None, f"{f.key} has no label"
    assert [legend.get_text(strip=True) for legend in page.select("#run-form legend")][:3] == [
        "Run", "Model", "Attention per role"]


def test_form_says_what_each_estimator_the_engine_runs_needs(client):
    text = " ".join(soup(client.get("/runs/new").text).get_text(" ").split())
    assert ("The engine runs gae, gpg, grpo, opo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo. "
            "gae trains a critic; grpo, rloo, reinforce_plus_plus_baseline, opo, gpg compare the samples of each "
            "prompt (rollout.n >= 2); remax subtracts the score of a greedy rollout.") in text


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
    from worker.ppo.advantage import names

    spec = {"algorithm.adv_estimator": "gdpo", "actor_rollout_ref.rollout.n": 2}
    resp = client.post("/api/runs", json={"spec": spec}, headers=write_headers)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["field"] == "spec.algorithm.adv_estimator"
    assert (f"attnboard's engine does not run adv_estimator gdpo (verl does); it runs {', '.join(names())}"
            in error["message"])
    saved = client.post("/api/specs", json={"name": "gdpo", "spec": spec}, headers=write_headers)
    assert saved.status_code == 201  # a spec may hold it (preview, import and export accept it)



@pytest.mark.parametrize("text,code_words", [
    ("a: &a [1, 2]\n" + "".join(f"l{i}: &l{i} [*{'a' if i == 0 else f'l{i - 1}'}, *{'a' if i == 0 else f'l{i - 1}'}]\n"
                                for i in range(20)), "more than"),  # an alias bomb
    ("trainer.project_name=" + "x" * MAX_INPUT_BYTES, "too long"),
    ("   ", "nothing to import"),
])
def test_the_forms_import_goes_through_the_apis_guard(client, read_headers, text, code_words):
    """The form's import and POST /api/import refuse the same texts, with the same message."""
    page = client.get("/runs/new").text
    resp = client.post("/runs/import", data={"verl_text": text, "csrf_token": csrf_of(page)})
    assert resp.status_code == 422
    shown = soup(resp.text).select_one("#import-errors").get_text(" ", strip=True)
    api = client.post("/api/import", json={"text": text}, headers=read_headers)
    assert api.status_code == 422
    message = api.json()["error"]["message"]
    assert code_words in message
    assert message.removeprefix("text: ") in shown


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
