"""Checkpoints on disk, in verl's layout and vocabulary; no torch here, so the app lists them too.

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt      the newest committed step (verl's tracker)
        global_step_4/
            actor/  critic/                    each trained role's sharded model and optimizer (DCP)
            rng/rank_0.pt ...                  each rank's torch RNG state
            checkpoint.json                    written last: step, data position, RNG of the data order,
                                               rollout generations, KL controller, model shapes, spec
        global_step_6.partial-<run id>/        a write in progress (or interrupted): never used

A checkpoint is written into ``global_step_N.partial-<run id>``, its ``checkpoint.json`` last; the folder is
then renamed to ``global_step_N`` (one atomic rename), and only then the tracker is rewritten (a temp file
and ``os.replace``). So a ``global_step_N`` folder is complete unless someone else wrote it: ``scan``
still checks the marker and every role folder's DCP ``.metadata``, and lists whatever fails the check,
and every ``.partial-`` folder, as skipped with the reason. ``trainer.max_actor_ckpt_to_keep`` and
``max_critic_ckpt_to_keep`` prune per role, as verl does, among the checkpoints of the same run only.

Where: ``checkpoint_folder`` resolves ``trainer.default_local_dir`` (verl's default interpolation
``checkpoints/${trainer.project_name}/${trainer.experiment_name}`` against the spec); a relative folder
goes under the run's artefact folder, and the service confines absolute ones to its checkpoint root
(``confine``): a checkpoint's DCP metadata is read with pickle, so only folders the engine wrote are read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from worker.spec import Issue, RunSpec, tree_get
from worker.spec.confine import resolved_local_dir

TRACKER = "latest_checkpointed_iteration.txt"
MARKER = "checkpoint.json"
STEP_PREFIX = "global_step_"
PARTIAL = ".partial-"
DCP_METADATA = ".metadata"
RNG_FOLDER = "rng"
FORMAT = 1
TRAINED_ROLES = ("actor", "critic")
MODEL_SECTIONS = {"actor": "actor_rollout_ref.model", "critic": "critic.model"}
"""The spec section of each checkpointed role's model (errors name keys under it)."""
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size")
"""Config attributes that decide the shapes of a model's parameters: a checkpoint only fits a model with
the same ones."""

_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")
_PARTIAL_DIR = re.compile(rf"^{STEP_PREFIX}(\d+){re.escape(PARTIAL)}(.+)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, or a checkpoint path that is not allowed; ``issues`` name the keys."""

    def __init__(self, issues: list[Issue]):
        self.issues = issues
        super().__init__("; ".join(f"{i.field}: {i.message}" for i in issues))

    def __reduce__(self):  # crosses the Ray boundary intact
        return (CheckpointError, (self.issues,))


@dataclass(frozen=True)
class Checkpoint:
    """A committed ``global_step_N`` folder and what its marker says."""

    step: int
    path: Path
    roles: tuple[str, ...]
    """Role folders present (pruning may have removed one)."""
    size_bytes: int
    meta: dict[str, Any] = field(repr=False)

    @property
    def trained(self) -> tuple[str, ...]:
        """The roles the run that wrote it trained."""
        return tuple(self.meta.get("roles", ()))

    @property
    def resumable(self) -> bool:
        """Every role the run trained is still there (not pruned)."""
        return set(self.trained) <= set(self.roles)

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id", ""))

    @property
    def saved_at(self) -> str | None:
        return self.meta.get("saved_at")

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "path": str(self.path), "size_bytes": self.size_bytes, "saved_at": self.saved_at,
                "roles": list(self.roles), "resumable": self.resumable, "run_id": self.run_id,
                "world_size": self.meta.get("world_size")}


@dataclass(frozen=True)
class Skipped:
    """A folder that looks like a checkpoint but is not a complete one, and why."""

    path: Path
    why: str

    @property
    def message(self) -> str:
        return f"skipped {self.path.name} in {self.path.parent}: {self.why}"


# --------------------------------------------------------------------------------------------
# Where


def expand(path: str | Path) -> Path:
    """``~`` and ``~user`` expanded where they name a home folder; kept as written otherwise."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~someone who does not exist here
        return Path(path)


def under(path: str | Path, folder: Path) -> Path:
    """``path`` (``~`` expanded) as is when absolute, else inside ``folder``."""
    given = expand(path)
    return given if given.is_absolute() else folder / given


def checkpoint_folder(spec: RunSpec, artefact_dir: Path) -> Path:
    """Where a run's checkpoints go: ``default_local_dir`` (``~`` expanded), under ``artefact_dir`` when relative."""
    return under(resolved_local_dir(spec), artefact_dir)


def confine(path: Path, roots: Iterable[Path] | None, *, key: str) -> Path:
    """``path`` resolved, when it lies inside one of ``roots`` (None: anywhere); else CheckpointError naming ``key``."""
    resolved = expand(path).resolve()
    if roots is None:
        return resolved
    allowed = [expand(r).resolve() for r in roots]
    if any(resolved == root or root in resolved.parents for root in allowed):
        return resolved
    raise CheckpointError([Issue(key, str(path), f"{str(path)!r} is outside the checkpoint folder of this service; "
                                                 f"valid: a relative path, or one under {', '.join(map(str, allowed))}",
                                 valid=[str(r) for r in allowed])])


def step_folder(folder: Path, step: int) -> Path:
    return folder / f"{STEP_PREFIX}{step}"


def partial_folder(folder: Path, step: int, run_id: str) -> Path:
    return folder / f"{STEP_PREFIX}{step}{PARTIAL}{_safe(run_id)}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64] or "run"


# --------------------------------------------------------------------------------------------
# Reading


def folder_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def read_marker(path: Path) -> dict[str, Any]:
    """A checkpoint folder's ``checkpoint.json``; ValueError saying what is wrong with it."""
    marker = path / MARKER
    try:
        meta = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {MARKER}: its write was interrupted") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{MARKER} cannot be read: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int) or not isinstance(meta.get("roles"), list):
        raise ValueError(f"{MARKER} is not a checkpoint marker (no step or roles)")
    return meta


def load_checkpoint_folder(path: Path) -> Checkpoint:
    """A ``global_step_N`` folder as a Checkpoint; ValueError when it is not a complete one."""
    match = _STEP_DIR.match(path.name)
    if match is None:
        raise ValueError(f"{path.name} is not a {STEP_PREFIX}N folder")
    meta = read_marker(path)
    step = int(match.group(1))
    if meta["step"] != step:
        raise ValueError(f"{MARKER} says step {meta['step']}, the folder step {step}")
    roles = []
    for role in TRAINED_ROLES:
        role_dir = path / role
        if role_dir.is_dir():
            if not (role_dir / DCP_METADATA).is_file():
                raise ValueError(f"{role}/ has no {DCP_METADATA}: its write was interrupted")
            roles.append(role)
    return Checkpoint(step=step, path=path, roles=tuple(roles), size_bytes=folder_size(path), meta=meta)


def scan(folder: Path) -> tuple[list[Checkpoint], list[Skipped]]:
    """The complete checkpoints in ``folder`` (oldest first) and the folders skipped, with why."""
    complete: list[Checkpoint] = []
    skipped: list[Skipped] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:  # missing, not a folder, or not readable: nothing to resume from here
        return [], []
    for entry in entries:
        if not entry.is_dir():
            continue
        if _PARTIAL_DIR.match(entry.name):
            skipped.append(Skipped(entry, "an unfinished write (no rename to its final name): interrupted"))
            continue
        if not _STEP_DIR.match(entry.name):
            continue
        try:
            complete.append(load_checkpoint_folder(entry))
        except ValueError as exc:
            skipped.append(Skipped(entry, str(exc)))
    complete.sort(key=lambda c: c.step)
    return complete, skipped


def newest(folder: Path, *, run_id: str | None = None) -> Checkpoint | None:
    """The newest resumable checkpoint in ``folder`` (only those ``run_id`` wrote, when given)."""
    found = [c for c in scan(folder)[0] if c.resumable and (run_id is None or c.run_id == run_id)]
    return found[-1] if found else None


def locate(path: Path) -> Checkpoint:
    """``trainer.resume_from_path``: a ``global_step_N`` folder, or a folder of them (its newest resumable
    one); CheckpointError naming the key otherwise."""
    key = "trainer.resume_from_path"
    if _STEP_DIR.match(path.name):
        try:
            found = load_checkpoint_folder(path)
        except ValueError as exc:
            raise CheckpointError([Issue(key, str(path), f"{path} is not a complete checkpoint: {exc}")]) from None
        if not found.resumable:
            raise CheckpointError([Issue(key, str(path), f"{path} lacks {', '.join(set(found.trained) - set(found.roles))}"
                                                         f" (pruned): it cannot be resumed")])
        return found
    if not path.is_dir():
        raise CheckpointError([Issue(key, str(path), f"{path} does not exist; valid: a {STEP_PREFIX}N folder or a "
                                                     f"folder holding them")])
    found_newest = newest(path)
    if found_newest is None:
        raise CheckpointError([Issue(key, str(path), f"{path} holds no complete checkpoint ({STEP_PREFIX}N folder "
                                                     f"with {MARKER})")])
    return found_newest


def read_tracker(folder: Path) -> int | None:
    try:
        return int((folder / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# Writing


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_marker(partial: Path, meta: dict[str, Any]) -> None:
    """The marker, written last into the partial folder."""
    _write_atomically(partial / MARKER, json.dumps(meta, sort_keys=True))


def commit(partial: Path, final: Path) -> None:
    """Rename the finished partial folder to its final name (replacing an older checkpoint of that step)."""
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.replaced-{uuid.uuid4().hex[:8]}")
        os.rename(final, old)
    os.rename(partial, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_tracker(folder: Path, step: int) -> None:
    _write_atomically(folder / TRACKER, f"{step}\n")


def remove_partials(folder: Path, run_id: str) -> list[Skipped]:
    """Delete the unfinished writes of ``run_id`` (left by a death during a save); returns what was removed."""
    removed = []
    for skipped in scan(folder)[1]:
        match = _PARTIAL_DIR.match(skipped.path.name)
        if match is not None and match.group(2) == _safe(run_id):
            shutil.rmtree(skipped.path, ignore_errors=True)
            removed.append(skipped)
    return removed


def prune(folder: Path, *, run_id: str, keep: dict[str, int | None]) -> list[str]:
    """verl's ``max_{actor,critic}_ckpt_to_keep``: each role's folder is kept in the newest ``keep[role]``
    checkpoints of ``run_id`` and removed from older ones; a checkpoint left with no role goes whole.
    Returns what was removed (``global_step_2/actor``)."""
    mine = [c for c in scan(folder)[0] if c.run_id == run_id]
    removed: list[str] = []
    for role, limit in keep.items():
        if limit is None:
            continue
        holding = [c for c in mine if role in c.roles]
        for old in holding[:max(len(holding) - limit, 0)]:
            shutil.rmtree(old.path / role, ignore_errors=True)
            removed.append(f"{old.path.name}/{role}")
    for c in mine:
        if not any((c.path / role).is_dir() for role in TRAINED_ROLES):
            shutil.rmtree(c.path, ignore_errors=True)
    return removed


# --------------------------------------------------------------------------------------------
# Fit: may this spec resume from that checkpoint? (pure)


def shape_of(config: Any) -> dict[str, Any]:
    """The shape-deciding attributes of a Hugging Face config (``SHAPE_KEYS``, those it has)."""
    text = getattr(config, "get_text_config", lambda: config)()
    return {key: getattr(text, key) for key in SHAPE_KEYS if getattr(text, key, None) is not None}


def fit_issues(meta: dict[str, Any], *, models: dict[str, dict[str, Any]], spec_tree: dict[str, Any],
               path: Path | str) -> list[Issue]:
    """Why a checkpoint (its marker ``meta``) cannot be resumed by a run training ``models``
    ({role: {"shape": {...}}}) with the spec ``spec_tree``: a trained role it lacks, or a role whose model
    shape differs, each naming the key to change (an ``override_config`` key when either spec sets it,
    else the model's ``path``). Empty when it fits."""
    issues: list[Issue] = []
    saved_models = meta.get("models") or {}
    saved_tree = meta.get("spec") or {}
    for role, now in models.items():
        section = MODEL_SECTIONS[role]
        if role not in saved_models:
            issues.append(Issue("algorithm.adv_estimator", tree_get(spec_tree, "algorithm.adv_estimator"),
                                f"the checkpoint at {path} holds no {role} (it was saved by a run with "
                                f"algorithm.adv_estimator={tree_get(saved_tree, 'algorithm.adv_estimator')!s}): resume "
                                f"refused"))
            continue
        before = saved_models[role].get("shape") or {}
        after = now.get("shape") or {}
        for attr in SHAPE_KEYS:
            if before.get(attr) == after.get(attr):
                continue
            overrides = [tree_get(tree, f"{section}.override_config") or {} for tree in (saved_tree, spec_tree)]
            key = (f"{section}.override_config.{attr}" if any(attr in o for o in overrides if isinstance(o, dict))
                   else f"{section}.path")
            issues.append(Issue(key, after.get(attr),
                                f"[{role}] the checkpoint at {path} was saved with {attr}={before.get(attr)}, this "
                                f"spec's model has {attr}={after.get(attr)}: resume refused (the parameters would "
                                f"not fit); resume with the spec it was saved with, or set "
                                f"trainer.resume_mode=disable", valid=[before.get(attr)]))
    return issues
