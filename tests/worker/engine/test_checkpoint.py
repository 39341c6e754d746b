"""The checkpoint layout (``worker.engine.checkpoint``): where, what counts as complete, commit, tracker, pruning,
and whether a spec may resume a checkpoint. The DCP contents are the engine's (tests/worker/engine/test_engine_resume.py);
here role folders hold a ``.metadata`` file as DCP leaves it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.utils.checkpoints import write_checkpoint as write
from worker.engine import checkpoint
from worker.engine.checkpoint import CheckpointError
from worker.spec import DEFAULT_LOCAL_DIR, parse_spec, spec_to_tree


@pytest.mark.parametrize("dotted,artefact,expected", [
    ({}, "/runs/7", "/runs/7/checkpoints/verl_examples/gsm8k"),
    ({"trainer.project_name": "p", "trainer.experiment_name": "e"}, "/runs/7", "/runs/7/checkpoints/p/e"),
    ({"trainer.default_local_dir": "ckpt"}, "/runs/7", "/runs/7/ckpt"),
    ({"trainer.default_local_dir": "/shared/ckpt"}, "/runs/7", "/shared/ckpt"),
    ({"trainer.default_local_dir": "~nobody-here-xyz/ckpt"}, "/runs/7", "/runs/7/~nobody-here-xyz/ckpt"),
])
def test_checkpoint_folder(dotted, artefact, expected):
    assert checkpoint.checkpoint_folder(parse_spec(dotted), Path(artefact)) == Path(expected)
    assert parse_spec({}).trainer.default_local_dir == DEFAULT_LOCAL_DIR


def test_confine_keeps_paths_inside_the_roots_and_names_the_key_otherwise(tmp_path):
    root = tmp_path / "runs"
    assert checkpoint.confine(root / "7" / "x", [root], key="k") == (root / "7" / "x").resolve()
    assert checkpoint.confine(Path("/etc/x"), None, key="k") == Path("/etc/x")
    with pytest.raises(CheckpointError) as caught:
        checkpoint.confine(root / ".." / "elsewhere", [root], key="trainer.default_local_dir")
    issue = caught.value.issues[0]
    assert issue.field == "trainer.default_local_dir" and "is outside the checkpoint folder" in issue.message
    assert issue.valid == [str(root.resolve())]


def test_scan_lists_complete_checkpoints_and_says_why_others_are_skipped(tmp_path):
    write(tmp_path, 2)
    write(tmp_path, 4, marker=False)
    write(tmp_path, 6, metadata=False)
    write(tmp_path, 8, roles=("critic",))
    (checkpoint.partial_folder(tmp_path, 10, "r1") / "actor").mkdir(parents=True)
    (tmp_path / "global_step_12").mkdir()
    (tmp_path / "global_step_12" / checkpoint.MARKER).write_text(json.dumps({"step": 11, "roles": []}))
    (tmp_path / "unrelated").mkdir()
    complete, skipped = checkpoint.scan(tmp_path)
    assert [(c.step, c.roles, c.resumable) for c in complete] == [(2, ("actor", "critic"), True),
                                                                  (8, ("critic",), False)]
    assert complete[0].size_bytes == 2 * 101 + len((tmp_path / "global_step_2" / checkpoint.MARKER).read_bytes())
    assert {s.path.name: s.why for s in skipped} == {
        "global_step_4": "no checkpoint.json: its write was interrupted",
        "global_step_6": "actor/ has no .metadata: its write was interrupted",
        "global_step_10.partial-r1": "an unfinished write (no rename to its final name): interrupted",
        "global_step_12": "checkpoint.json says step 11, the folder step 12",
    }
    assert checkpoint.newest(tmp_path).step == 2
    assert checkpoint.scan(tmp_path / "missing") == ([], [])


def test_newest_and_locate(tmp_path):
    write(tmp_path, 2, run_id="a")
    write(tmp_path, 4, run_id="b")
    assert checkpoint.newest(tmp_path).step == 4
    assert checkpoint.newest(tmp_path, run_id="a").step == 2
    assert checkpoint.newest(tmp_path, run_id="c") is None
    assert checkpoint.locate(tmp_path).step == 4
    assert checkpoint.locate(tmp_path / "global_step_2").step == 2
    for path, fragment in ((tmp_path / "nope", "does not exist"), (tmp_path / "global_step_9", "is not a complete "
                                                                                                "checkpoint")):
        with pytest.raises(CheckpointError, match=fragment) as caught:
            checkpoint.locate(path)
        assert caught.value.issues[0].field == "trainer.resume_from_path"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        checkpoint.locate(empty)


def test_commit_renames_replaces_and_the_tracker_follows(tmp_path):
    write(tmp_path, 2, run_id="old")
    partial = checkpoint.partial_folder(tmp_path, 2, "new")
    (partial / "actor").mkdir(parents=True)
    (partial / "actor" / checkpoint.DCP_METADATA).write_bytes(b"m")
    checkpoint.write_marker(partial, {"step": 2, "run_id": "new", "roles": ["actor"]})
    checkpoint.commit(partial, checkpoint.step_folder(tmp_path, 2))
    checkpoint.write_tracker(tmp_path, 2)
    assert [c.run_id for c in checkpoint.scan(tmp_path)[0]] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", checkpoint.TRACKER]
    assert checkpoint.read_tracker(tmp_path) == 2


def test_remove_partials_removes_only_this_runs(tmp_path):
    for run_id in ("mine", "theirs"):
        checkpoint.partial_folder(tmp_path, 4, run_id).mkdir(parents=True)
    removed = checkpoint.remove_partials(tmp_path, "mine")
    assert [r.path.name for r in removed] == ["global_step_4.partial-mine"]
    assert [p.name for p in tmp_path.iterdir()] == ["global_step_4.partial-theirs"]


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 30), min_size=1, max_size=6, unique=True),
       keep_actor=st.one_of(st.none(), st.integers(1, 4)), keep_critic=st.one_of(st.none(), st.integers(1, 4)))
def test_prune_keeps_each_roles_newest_of_this_run_only(steps, keep_actor, keep_critic):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for step in steps:
            write(folder, step)
        write(folder, 100, run_id="someone-else")
        checkpoint.prune(folder, run_id="r1", keep={"actor": keep_actor, "critic": keep_critic})
        ordered = sorted(steps)
        for role, keep in (("actor", keep_actor), ("critic", keep_critic)):
            kept = [s for s in ordered if (checkpoint.step_folder(folder, s) / role).is_dir()]
            assert kept == (ordered if keep is None else ordered[-keep:])
        for step in ordered:  # a checkpoint left with no role is removed whole
            path = checkpoint.step_folder(folder, step)
            assert path.exists() == any((path / r).is_dir() for r in checkpoint.TRAINED_ROLES)
        assert checkpoint.newest(folder, run_id="someone-else").step == 100


SHAPE = {"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 100}


@pytest.mark.parametrize("saved_models,now_models,now_dotted,expected", [
    ({"actor": {"shape": SHAPE}}, {"actor": {"shape": SHAPE}}, {}, []),
    ({"actor": {"shape": SHAPE}}, {"actor": {"shape": {**SHAPE, "num_hidden_layers": 3}}},
     {"actor_rollout_ref.model.override_config": {"num_hidden_layers": 3}},
     [("actor_rollout_ref.model.override_config.num_hidden_layers", 3)]),
    ({"actor": {"shape": SHAPE}}, {"actor": {"shape": {**SHAPE, "hidden_size": 32}}}, {},
     [("actor_rollout_ref.model.path", 32)]),
    ({"actor": {"shape": SHAPE}}, {"actor": {"shape": SHAPE}, "critic": {"shape": SHAPE}}, {},
     [("algorithm.adv_estimator", "gae")]),
    ({"actor": {"shape": SHAPE}, "critic": {"shape": SHAPE}}, {"actor": {"shape": SHAPE}},
     {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 2}, []),
    ({"actor": {"shape": SHAPE}, "critic": {"shape": SHAPE}},
     {"actor": {"shape": SHAPE}, "critic": {"shape": {**SHAPE, "vocab_size": 50}}},
     {"critic.model.override_config": {"vocab_size": 50}}, [("critic.model.override_config.vocab_size", 50)]),
])
def test_fit_issues_name_the_key_that_changed_the_shape(saved_models, now_models, now_dotted, expected):
    meta = {"models": saved_models, "spec": spec_to_tree(parse_spec({}))}
    issues = checkpoint.fit_issues(meta, models=now_models, spec_tree=spec_to_tree(parse_spec(now_dotted)),
                                   path="/c/global_step_4")
    assert [(i.field, i.value) for i in issues] == expected
    for issue in issues:
        assert "/c/global_step_4" in issue.message and "resume refused" in issue.message
