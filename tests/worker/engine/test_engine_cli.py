"""``python -m worker run SPEC``: a spec file run without the app, events as JSON lines, actor saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from worker.__main__ import main
from worker.spec import spec_to_tree
from worker.spec.presets import tiny_cpu_spec

ROOT = Path(__file__).resolve().parents[3]


def test_a_missing_spec_file_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_an_invalid_spec_exits_2_naming_the_field(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"actor_rollout_ref": {"actor": {"ppo_epochs": 0}}}))
    assert main(["run", str(path)]) == 2
    assert "actor_rollout_ref.actor.ppo_epochs" in capsys.readouterr().err


def test_resume_sets_verls_resume_path_and_a_missing_folder_exits_2(tmp_path, capsys):
    from worker.__main__ import _load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_to_tree(tiny_cpu_spec())))
    spec, _ = _load_spec(str(path), str(tmp_path / "ckpt" / "global_step_4"))
    assert spec.trainer.resume_mode == "resume_path"
    assert spec.trainer.resume_from_path == str(tmp_path / "ckpt" / "global_step_4")
    assert main(["run", str(path), "--resume", str(tmp_path / "nowhere")]) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.ray
def test_run_prints_json_events_and_saves_the_actor(tmp_path):
    spec = tiny_cpu_spec(**{"algorithm.adv_estimator": "grpo", "trainer.total_training_steps": 2,
                            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16, "trainer.save_freq": 2})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec_to_tree(spec)))
    saved = tmp_path / "actor"
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "worker", "run", str(path), "--json", "--save-actor", str(saved),
                           "--run-id", "cli", "--cache-dir", str(tmp_path / "models"),
                           "--artefact-dir", str(tmp_path / "run")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["payload"]["step"] for e in events if e["kind"] == "metric"] == [1, 2]
    assert events[-1]["payload"]["state"] == "succeeded"
    saved_checkpoint = tmp_path / "run" / "checkpoints" / "attnboard" / "tiny-cpu" / "global_step_2"
    assert (saved_checkpoint / "checkpoint.json").is_file() and (saved_checkpoint / "actor" / ".metadata").is_file()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in saved.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(saved)
    assert model.config._attn_implementation == "sdpa" and AutoTokenizer.from_pretrained(saved).eos_token_id is not None


def test_the_console_prints_the_summary_fields_of_every_role_and_rank_in_role_order(capsys):
    """The standalone runner's table: one row per role and rank, the payload's SUMMARY_FIELDS as columns."""
    import json
    from pathlib import Path

    from worker.__main__ import _Console
    from worker.core.attention_payload import SUMMARY_FIELDS

    events = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "engine_events.json").read_text())
    console = _Console(as_json=False)
    console.console.width = 400
    for event in events["succeeded"]:
        console(event)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "requested" in line and "effective" in line)
    bar = "┃" if "┃" in header else "│"
    assert [c.replace("_", " ") for c in SUMMARY_FIELDS] == [c.strip() for c in header.strip("┃│ ").split(bar)]
    rows = [line for line in out.splitlines() if "sdpa x" in line]
    assert [r.split("│")[1].strip() for r in rows] == ["actor", "actor", "rollout", "rollout", "reference", "reference",
                                                       "critic", "critic"]
    assert all("flash_attention" in r and "float32" in r for r in rows)
