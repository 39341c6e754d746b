"""The attnboard CLI on the seed's examples: per-role tables that follow the rules, JSON for machines,
clear errors with exit code 2. Runs the real installed console script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.factories import HEADS_ERRORS, sp4_spec

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed"
ATTNBOARD = [sys.executable, "-m", "app.cli"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ATTNBOARD, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def roles(stdout: str) -> dict:
    return json.loads(stdout)["roles"]


# Seed example -> the effective implementation per role on a CPU target (eager/sdpa load on CPU).
SEED_EXPECTED = {
    "eager.sh": {"actor": "eager", "rollout": "eager", "reference": "eager", "critic": None},
    "sdpa.sh": {"actor": "sdpa", "rollout": "sdpa", "reference": "sdpa", "critic": None},
    "critic.sh": {"actor": "eager", "rollout": "eager", "reference": "eager", "critic": "eager"},
    "seed.yaml": {"actor": "eager", "rollout": "eager", "reference": "eager", "critic": "eager"},
    "troubleshooting.sh": {"actor": "eager", "rollout": "eager", "reference": "eager", "critic": None},
}


@pytest.mark.parametrize("example", sorted(SEED_EXPECTED))
def test_resolve_seed_examples_json(example):
    proc = run("resolve", str(SEED / example), "--env", "cpu", "--json")
    expected = SEED_EXPECTED[example]
    result = roles(proc.stdout)
    # Without a critic override the critic keeps verl's default flash_attention_2, which cannot load on CPU
    # under the strict policy: the command says so with exit code 1 and the exact transformers message.
    critic = result["critic"]
    if expected["critic"] is None:
        assert critic["source"] == "default" and critic["status"] == "error"
        assert "doesn't seem to be installed" in critic["error"]
        assert proc.returncode == 1
    else:
        assert (critic["effective"], critic["source"], critic["status"]) == ("eager", "override", "ok")
        assert "verl-critic-defect" in [r["rule"] for r in critic["reasons"]]
        assert proc.returncode == 0
    for role in ("actor", "rollout", "reference"):
        assert (result[role]["effective"], result[role]["source"], result[role]["status"]) == (
            expected[role], "override", "ok")


@pytest.mark.parametrize("example", ["eager.sh", "critic.sh"])
def test_resolve_prints_a_table_per_role(example):
    proc = run("resolve", str(SEED / example), "--env", "cuda-sm80-fa2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for role in ("actor", "rollout", "reference", "critic"):
        assert any(line.strip("│┃ ").startswith(role) for line in lines), role
    assert "[override] eager set by actor_rollout_ref.model.override_config.attn_implementation." in proc.stdout
    assert "skipped placeholder [other parameters...]" in proc.stderr


def test_resolve_on_a_t4_names_the_pre_ampere_story():
    proc = run("resolve", str(SEED / "eager.sh"), "--env", "cuda-sm75", "--json")
    critic = roles(proc.stdout)["critic"]
    assert critic["status"] == "error" and critic["requested"] == "flash_attention_2"


def test_unknown_profile_is_exit_2_with_valid_names():
    proc = run("resolve", str(SEED / "eager.sh"), "--env", "tpu", "--json")
    assert proc.returncode == 2
    error = json.loads(proc.stdout)["error"]
    assert error["field"] == "--env" and "cuda-sm80-fa2" in error["valid"]


def test_missing_file_is_exit_2(tmp_path):
    proc = run("resolve", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_run_is_the_engine_alone_and_checks_its_resume_folder(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("trainer:\n  device: cpu\n")
    proc = run("run", str(spec), "--resume", str(tmp_path / "no-such-checkpoint"))
    assert proc.returncode == 2 and "--resume" in proc.stderr and "no such folder" in proc.stderr
    assert run("run", str(tmp_path / "nope.yaml")).returncode == 2


def test_bad_spec_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("critic:\n  model:\n    override_config:\n      attn_implementation: flsh\n")
    proc = run("resolve", str(bad), "--json")
    assert proc.returncode == 2
    assert "critic.model.override_config.attn_implementation" in proc.stdout


def test_env_file_from_a_probe(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"name": "my-node", "device": "cuda", "compute_capability": [8, 6],
                                 "flash_attn_version": "2.8.3"}))
    proc = run("resolve", str(SEED / "sdpa.sh"), "--env-file", str(probe), "--json")
    data = json.loads(proc.stdout)
    assert data["environment"] == "my-node"
    assert data["roles"]["critic"]["effective"] == "flash_attention_2"


def test_import_then_export_round_trip(tmp_path):
    imported = run("import", str(SEED / "critic.sh"))
    assert imported.returncode == 0, imported.stderr
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(imported.stdout)
    exported = run("export", str(spec_file), "--format", "cli", "--json")
    text = json.loads(exported.stdout)["text"]
    assert "+actor_rollout_ref.model.override_config.attn_implementation=eager" in text
    assert "+critic.model.override_config.attn_implementation=eager" in text
    again = tmp_path / "again.sh"
    again.write_text(text)
    a = json.loads(run("import", str(again), "--json").stdout)["spec"]
    b = json.loads(run("import", str(spec_file), "--json").stdout)["spec"]
    assert a == b


def test_export_rejects_unknown_format():
    proc = run("export", str(SEED / "eager.sh"), "--format", "toml", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["valid"] == ["cli", "yaml"]


def test_migrate_then_token_create(tmp_path):
    env = {"ATTNBOARD_DATA_DIR": str(tmp_path / "data"), "ATTNBOARD_DATABASE_URL": ""}
    migrated = run("migrate", "--json", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["database"].endswith("attnboard.db")
    created = run("token", "create", "nightly-ci", "--json", env=env)
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)
    assert token["token"].startswith("atb_") and token["scopes"] == ["read", "write"]
    # Only the hash is stored: the plaintext is nowhere in the database file.
    assert token["token"].encode() not in (tmp_path / "data" / "attnboard.db").read_bytes()
    readonly = run("token", "create", "dash", "--scope", "read", "--json", env=env)
    assert json.loads(readonly.stdout)["scopes"] == ["read"]


def test_token_create_rejects_an_unknown_scope(tmp_path):
    proc = run("token", "create", "x", "--scope", "root", "--json", env={"ATTNBOARD_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["valid"] == ["read", "write", "admin"]


def test_token_commands_find_the_served_database_and_name_it(tmp_path):
    """Run from another folder, the token commands write where `attnboard serve` reads (never a fresh ./data), say
    which database, and list and revoke tokens."""
    served, elsewhere = tmp_path / "served", tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "ATTNBOARD_DATA_DIR": "", "ATTNBOARD_DATABASE_URL": ""}
    def cli_in(folder, *args, **env):
        return subprocess.run([*ATTNBOARD, *args], capture_output=True, text=True, timeout=120, cwd=folder,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **home, **env})
    refused = cli_in(elsewhere, "token", "create", "ci", "--json")
    assert refused.returncode == 2 and json.loads(refused.stdout)["error"]["field"] == "ATTNBOARD_DATA_DIR"
    assert not (elsewhere / "data" / "attnboard.db").exists()
    assert cli_in(tmp_path, "migrate", ATTNBOARD_DATA_DIR=str(served / "data")).returncode == 0  # the server's start
    from app.core.config import Settings, record_served

    os.environ["XDG_CONFIG_HOME"] = home["XDG_CONFIG_HOME"]
    try:
        record_served(Settings(DATA_DIR=served / "data", DATABASE_URL=""))  # what `attnboard serve` notes
    finally:
        del os.environ["XDG_CONFIG_HOME"]
    created = cli_in(elsewhere, "token", "create", "ci", "--scope", "admin", "--json")
    assert created.returncode == 0, created.stderr
    body = json.loads(created.stdout)
    assert body["database"] == f"sqlite:///{(served / 'data' / 'attnboard.db').resolve()}"
    assert body["scopes"] == ["admin", "read", "write"] and not (elsewhere / "data" / "attnboard.db").exists()
    listed = json.loads(cli_in(elsewhere, "token", "list", "--json").stdout)
    assert [(t["id"], t["name"], t["revoked"]) for t in listed["tokens"]] == [(body["id"], "ci", False)]
    assert "token" not in listed["tokens"][0]
    revoked = cli_in(elsewhere, "token", "revoke", str(body["id"]), "--json")
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["revoked"] is True
    assert json.loads(cli_in(elsewhere, "token", "list", "--json").stdout)["tokens"][0]["revoked"] is True
    missing = cli_in(elsewhere, "token", "revoke", "999", "--json")
    assert missing.returncode == 2 and json.loads(missing.stdout)["error"]["field"] == "TOKEN_ID"


# --------------------------------------------------------------------------------------------
# resolve runs the checks of POST /api/resolve (one function: worker.attention.preview.preview)

def test_resolve_sp4_on_a_14_head_2_kv_head_model_is_exit_2_naming_both(tmp_path):
    _, spec = sp4_spec(tmp_path)
    spec_file = tmp_path / "sp4.json"
    spec_file.write_text(json.dumps(spec))
    proc = run("resolve", str(spec_file), "--env", "cuda-sm90-fa2", "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [i["message"] for i in json.loads(proc.stdout)["issues"] if i["severity"] == "error"]
    assert errors == HEADS_ERRORS
    table = run("resolve", str(spec_file), "--env", "cuda-sm90-fa2")
    assert table.returncode == 2 and all(e in table.stderr for e in HEADS_ERRORS)


def test_resolve_over_http_reports_the_same_issues(tmp_path, make_client, session):
    from tests.conftest import _token_headers

    model, spec = sp4_spec(tmp_path)
    client = make_client(MODEL_ROOTS=[model.parent])
    headers = _token_headers(session, ["read"])
    body = client.post("/api/resolve", json={"spec": spec, "environment": "cuda-sm90-fa2"}, headers=headers).json()
    assert [i["message"] for i in body["issues"] if i["severity"] == "error"] == HEADS_ERRORS
    # outside the allowed roots the folder is not read (said, not guessed) and a launch would refuse the path
    other = make_client()
    body = other.post("/api/resolve", json={"spec": spec, "environment": "cuda-sm90-fa2"}, headers=headers).json()
    assert [(i["severity"], i["field"]) for i in body["issues"] if i["severity"] == "error"] == [
        ("error", "spec.actor_rollout_ref.model.path")]
    warnings = [i for i in body["issues"] if i["severity"] == "warning"]
    assert len(warnings) == 1 and "ATTNBOARD_MODEL_ROOTS" in warnings[0]["message"]


def test_resolve_sp3_on_8_gpus_is_exit_2(tmp_path):
    spec_file = tmp_path / "sp3.yaml"
    spec_file.write_text("actor_rollout_ref:\n  actor:\n    fsdp_config:\n      ulysses_sequence_parallel_size: 3\n")
    proc = run("resolve", str(spec_file), "--json")
    assert proc.returncode == 2
    assert "must divide the world size (8" in proc.stdout


def test_import_of_a_launch_script_lists_the_pass_through(tmp_path):
    script = Path(__file__).resolve().parents[1] / "worker" / "interop" / "fixtures" / "verl_scripts" / "dapo_style_main_ppo.sh"
    data = json.loads(run("import", str(script), "--json").stdout)
    assert data["spec"]["verl_passthrough"]["+reward_model.reward_kwargs.overlong_buffer_cfg.len"] == 4096
    assert data["verl_passthrough"] == data["spec"]["verl_passthrough"]


def test_resolve_confine_checks_paths_as_the_server_does(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("data:\n  train_files: /etc/shadow\nactor_rollout_ref:\n  model:\n    path: builtin:tiny-llama\n"
                    "critic:\n  model:\n    path: builtin:tiny-llama\ntrainer:\n  device: cpu\n  n_gpus_per_node: 1\n")
    env = {"ATTNBOARD_DATA_DIR": str(tmp_path / "data")}
    plain = run("resolve", str(spec), "--json", env=env)
    assert "data.train_files" not in [i["field"] for i in json.loads(plain.stdout)["issues"] if i["severity"] == "error"]
    confined = run("resolve", str(spec), "--confine", "--json", env=env)
    assert confined.returncode == 2
    assert "data.train_files" in [i["field"] for i in json.loads(confined.stdout)["issues"]]


VEOMNI_SCRIPT = """#!/usr/bin/env bash
set -xeuo pipefail
python3 -m verl.trainer.main_ppo \\
    model_engine=veomni \\
    algorithm.adv_estimator=gae \\
    actor_rollout_ref.model.path=builtin:tiny-qwen2 \\
    critic.model.path=builtin:tiny-qwen2 \\
    actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2 \\
    critic.veomni.attn_implementation=sdpa \\
    actor_rollout_ref.rollout.name=vllm
"""


def test_resolve_a_veomni_script_shows_verls_rename_and_the_critics_own_key(tmp_path):
    """model_engine=veomni: VeOmni renames flash_attention_2 for actor and reference (which inherits the actor's
    key) and honours the critic's own critic.veomni.attn_implementation; the table and the JSON say so."""
    script = tmp_path / "run_qwen_veomni.sh"
    script.write_text(VEOMNI_SCRIPT)
    proc = run("resolve", str(script), "--env", "cuda-sm90-fa2", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model_engine"] == "veomni"
    engine = {name: role["verl_engine"] for name, role in data["roles"].items() if role["verl_engine"]}
    assert {name: (e["key"], e["requested"], e["source"], e["effective"]) for name, e in engine.items()} == {
        "actor": ("actor_rollout_ref.actor.veomni.attn_implementation", "flash_attention_2", "set",
                  "veomni_flash_attention_2_with_sp"),
        "reference": ("actor_rollout_ref.ref.veomni.attn_implementation", "flash_attention_2", "inherited",
                      "veomni_flash_attention_2_with_sp"),
        "critic": ("critic.veomni.attn_implementation", "sdpa", "set", "sdpa"),
    }
    assert "verl-engine-rewrite" in [r["rule"] for r in engine["actor"]["reasons"]]
    assert "verl-critic-honoured" in [r["rule"] for r in engine["critic"]["reasons"]]

    table = run("resolve", str(script), "--env", "cuda-sm90-fa2")
    assert table.returncode == 0, table.stderr
    rows = {line.strip("│┃ ").split()[0]: line for line in table.stdout.splitlines() if "│" in line}
    assert rows["actor"].rstrip(" │").endswith("veomni_flash_attention_2_with_sp")
    assert rows["critic"].rstrip(" │").endswith("sdpa")
    assert ("under verl (model_engine=veomni): actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2 "
            "(set) -> veomni_flash_attention_2_with_sp") in table.stdout
    assert ("[verl-engine-rewrite] VeOmniEngineConfig.__post_init__ renames flash_attention_2 to "
            "veomni_flash_attention_2_with_sp") in table.stdout
    assert ("under verl (model_engine=veomni): critic.veomni.attn_implementation=sdpa (set) -> sdpa"
            in table.stdout)
