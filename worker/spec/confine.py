"""Every path a spec names, checked against the folders the service allows, before a run is stored.

``path_issues(spec, roots)`` is what ``POST /api/runs``, the form and ``POST /api/resolve`` refuse (422 naming the
key): model folders inside the model roots, data files inside the data roots, checkpoint folders inside the
checkpoint root, and a relative ``trainer.default_local_dir`` inside the run's own folder (run 45 never writes
into run 7's).

No existence oracle: a path is judged by its text first (``..`` folded, ``~`` expanded), so a path outside every
root gets the same answer whether or not something exists there; only a path whose text lies inside a root is
resolved, to refuse a symbolic link that leads out. No file is opened, and no error carries file content.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from worker.spec.schema import DEFAULT_LOCAL_DIR, Issue, RunSpec

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class Roots:
    """The folders a service allows. Empty model or data roots allow the built-in models or tasks only; no
    checkpoint root refuses absolute checkpoint paths (relative ones stay in the run's own folder)."""

    models: tuple[Path, ...] = ()
    data: tuple[Path, ...] = ()
    checkpoints: Path | None = None


def resolved_local_dir(spec: RunSpec) -> str:
    """``trainer.default_local_dir`` with verl's default interpolation resolved against the spec."""
    trainer = spec.trainer
    if trainer.default_local_dir == DEFAULT_LOCAL_DIR:
        return f"checkpoints/{trainer.project_name}/{trainer.experiment_name}"
    return trainer.default_local_dir


def _expanded(text: str) -> str:
    try:
        return os.path.expanduser(text)
    except RuntimeError:  # ~someone who does not exist here
        return text


def _lexically_inside(path: str, root: Path) -> bool:
    """Whether ``path`` (absolute, ``..`` folded without touching the disk) lies in ``root``."""
    folded = os.path.normpath(path)
    base = os.path.normpath(str(root))
    return folded == base or folded.startswith(base.rstrip(os.sep) + os.sep)


def inside(path: str, roots: tuple[Path, ...]) -> bool:
    """Whether absolute ``path`` lies in one of ``roots``: by its text, and, only then, with links resolved."""
    for root in roots:
        if _lexically_inside(path, root):
            real_root = Path(os.path.realpath(root))
            if _lexically_inside(os.path.realpath(path), real_root):
                return True
    return False


def _listing(roots: tuple[Path, ...], setting: str) -> str:
    return f"a path under {setting} ({', '.join(map(str, roots))})" if roots else f"{setting} is empty"


def _model_issue(key: str, value: str, roots: Roots) -> Issue | None:
    if value.startswith(BUILTIN_PREFIX):
        return None
    text = _expanded(value)
    valid = f"builtin:<preset>, or {_listing(roots.models, 'ATTNBOARD_MODEL_ROOTS')}"
    if os.path.isabs(text):
        candidates = [text]
    elif ".." not in Path(text).parts:
        candidates = [os.path.join(root, text) for root in roots.models]  # a relative folder is looked up in each root
    else:
        candidates = []
    if candidates and any(inside(c, roots.models) for c in candidates):
        return None
    return Issue(key, value, f"{key} {value!r} is outside the folders models may be loaded from; valid: {valid}",
                 valid=valid)


def _data_issue(key: str, value: str, roots: Roots) -> Issue | None:
    if value.startswith(BUILTIN_PREFIX):
        return None
    text = _expanded(value)
    valid = f"builtin:<task>, or an absolute file path in {_listing(roots.data, 'ATTNBOARD_DATA_ROOTS')}"
    if os.path.isabs(text) and inside(text, roots.data):
        return None
    return Issue(key, value, f"{key} {value!r} is outside the folders data may be read from; valid: {valid}",
                 valid=valid)


def _checkpoint_issues(spec: RunSpec, roots: Roots) -> list[Issue]:
    issues = []
    root = (roots.checkpoints,) if roots.checkpoints is not None else ()
    folder = _expanded(resolved_local_dir(spec))
    key = "trainer.default_local_dir"
    if os.path.isabs(folder):
        if not inside(folder, root):
            valid = f"a relative path (under the run's own folder), or {_listing(root, 'ATTNBOARD_CHECKPOINT_DIR')}"
            issues.append(Issue(key, folder, f"{key} {folder!r} is outside the checkpoint folder of this service; "
                                f"valid: {valid}", valid=valid))
    elif os.path.normpath(folder).split(os.sep)[0] == "..":
        valid = "a relative path that stays inside the run's own folder (no '..' above it)"
        issues.append(Issue(key, folder, f"{key} {folder!r} leaves the run's own folder (it would write into "
                            f"another run's checkpoints); valid: {valid}", valid=valid))
    resume = spec.trainer.resume_from_path
    if resume and os.path.isabs(_expanded(resume)) and not inside(_expanded(resume), root):
        key = "trainer.resume_from_path"
        valid = f"a path relative to the run's folder, or {_listing(root, 'ATTNBOARD_CHECKPOINT_DIR')}"
        issues.append(Issue(key, resume, f"{key} {resume!r} is outside the checkpoint folder of this service; "
                            f"valid: {valid}", valid=valid))
    return issues


def path_issues(spec: RunSpec, roots: Roots) -> list[Issue]:
    """The spec's paths that lie outside ``roots``, one issue per key (see the module docstring)."""
    issues = [_model_issue("actor_rollout_ref.model.path", spec.actor_rollout_ref.model.path, roots)]
    if spec.has_critic:
        issues.append(_model_issue("critic.model.path", spec.critic.model.path, roots))
    files = spec.data.train_files
    for i, name in enumerate([files] if isinstance(files, str) else files):
        issues.append(_data_issue("data.train_files" if isinstance(files, str) else f"data.train_files.{i}", name, roots))
    return [i for i in issues if i is not None] + _checkpoint_issues(spec, roots)
