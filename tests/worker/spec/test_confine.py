"""Every path of a spec against the allowed folders (``worker.spec.confine``): a table of paths, links that
lead out, and no existence oracle (the answer for a path outside the roots never depends on the disk)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.spec import parse_spec
from worker.spec.confine import Roots, path_issues

BUILTIN = {"actor_rollout_ref.model.path": "builtin:tiny-llama", "critic.model.path": "builtin:tiny-llama",
           "data.train_files": "builtin:count"}


@pytest.fixture
def roots(tmp_path) -> Roots:
    for name in ("models", "data", "ckpt"):
        (tmp_path / name).mkdir()
    return Roots(models=(tmp_path / "models",), data=(tmp_path / "data",), checkpoints=tmp_path / "ckpt")


def issues(roots: Roots, **keys) -> list[str]:
    return [i.field for i in path_issues(parse_spec({**BUILTIN, **keys}), roots)]


@pytest.mark.parametrize("keys,refused", [
    ({}, []),
    ({"data.train_files": "/etc/shadow"}, ["data.train_files"]),
    ({"data.train_files": "/proc/self/environ"}, ["data.train_files"]),
    ({"data.train_files": "../../../../etc/passwd"}, ["data.train_files"]),
    ({"data.train_files": "{data}/train.parquet"}, []),
    ({"data.train_files": "{data}/../secret.parquet"}, ["data.train_files"]),
    ({"data.train_files": ["builtin:count", "/etc/passwd"]}, ["data.train_files.1"]),
    ({"data.train_files": "relative.parquet"}, ["data.train_files"]),
    ({"actor_rollout_ref.model.path": "/etc"}, ["actor_rollout_ref.model.path"]),
    ({"actor_rollout_ref.model.path": "{models}/qwen"}, []),
    ({"actor_rollout_ref.model.path": "qwen"}, []),  # looked up under the model roots
    ({"actor_rollout_ref.model.path": "../qwen"}, ["actor_rollout_ref.model.path"]),
    ({"critic.model.path": "/root", "algorithm.adv_estimator": "gae"}, ["critic.model.path"]),
    ({"critic.model.path": "/root", "algorithm.adv_estimator": "grpo"}, []),  # no critic, its path is unused
    ({"trainer.default_local_dir": "../7/checkpoints"}, ["trainer.default_local_dir"]),
    ({"trainer.default_local_dir": "a/../../7"}, ["trainer.default_local_dir"]),
    ({"trainer.default_local_dir": "mine/ckpt"}, []),
    ({"trainer.experiment_name": "../../../7"}, ["trainer.default_local_dir"]),
    ({"trainer.experiment_name": "../../7"}, []),  # checkpoints/verl_examples/../../7: the run folder's own 7
    ({"trainer.default_local_dir": "{ckpt}/shared"}, []),
    ({"trainer.default_local_dir": "/tmp/elsewhere"}, ["trainer.default_local_dir"]),
    ({"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "/etc"}, ["trainer.resume_from_path"]),
    ({"trainer.resume_mode": "resume_path", "trainer.resume_from_path": "{ckpt}/7/checkpoints"}, []),
])
def test_paths_against_the_roots(roots, keys, refused):
    where = {"models": roots.models[0], "data": roots.data[0], "ckpt": roots.checkpoints}
    filled = {k: [p.format(**where) for p in v] if isinstance(v, list) else
              v.format(**where) if isinstance(v, str) else v for k, v in keys.items()}
    assert issues(roots, **filled) == refused


def test_a_link_inside_a_root_that_leads_out_is_refused(roots, tmp_path):
    os.symlink("/etc", roots.data[0] / "escape")
    assert issues(roots, **{"data.train_files": str(roots.data[0] / "escape" / "passwd")}) == ["data.train_files"]


def test_no_existence_oracle(roots, tmp_path):
    """Outside the roots, an existing file and a missing one get the same answer, apart from the path itself."""
    present = tmp_path / "present.parquet"
    present.write_bytes(b"PAR1 secret content")
    messages = []
    for path in (present, tmp_path / "missing.parquet"):
        (issue,) = path_issues(parse_spec({**BUILTIN, "data.train_files": str(path)}), roots)
        messages.append(issue.message.replace(str(path), "PATH"))
        assert "secret" not in issue.message
    assert messages[0] == messages[1]


def test_without_roots_only_builtins_and_the_runs_own_folder(tmp_path):
    assert issues(Roots()) == []
    assert issues(Roots(), **{"data.train_files": str(tmp_path)}) == ["data.train_files"]
    assert issues(Roots(), **{"trainer.default_local_dir": str(Path(tmp_path))}) == ["trainer.default_local_dir"]
