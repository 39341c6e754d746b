"""The preview of a spec on a target environment, with every check a launch would make before loading a
model: one function for ``attnboard resolve`` and ``POST /api/resolve``.

It adds to the pure resolution (``worker.attention.resolution``) the cross-field rules of ``check_spec`` with the
model's head counts, read from the model folder's config.json when the folder is here (a built-in
preset's are known). I/O: that one small file per role.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worker.attention.model_config import BUILTIN_ARCHITECTURES, ModelPathError, model_info, preset_info
from worker.attention.resolution import Resolution, resolve
from worker.core.environment import Environment
from worker.spec import Issue, ModelInfo, RunSpec, check_spec

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class Preview:
    resolution: Resolution
    issues: list[Issue]
    """Errors first: the spec's cross-field rules (Ulysses sizes against the model's heads, batch
    arithmetic, ...), then warnings, among them what attnboard's engine does not run."""

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]


def _model(path: str, field: str, roots: list[Path] | None) -> tuple[ModelInfo | None, Issue | None]:
    """A role's model numbers, or why they were not read (a warning: the checks that need them are skipped).

    ``roots``: the folders a server may read models from (``ATTNBOARD_MODEL_ROOTS``); None reads any
    local folder (the CLI, on the user's own machine)."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        return (preset_info(name), None) if name in BUILTIN_ARCHITECTURES else (None, None)
    folder = Path(path).expanduser()
    if roots is not None:
        real_roots = [Path(r).expanduser().resolve() for r in roots]
        if not folder.is_absolute():  # looked up under each root, as the engine does
            folder = next((r / folder for r in real_roots if (r / folder).exists()), folder)
        real = folder.resolve() if folder.is_absolute() else None
        if real is None or not any(real.is_relative_to(r) for r in real_roots):
            return None, Issue(field, path, "not inside the allowed model folders (ATTNBOARD_MODEL_ROOTS): the "
                                            "checks against the model's head counts were skipped", severity="warning")
    if not (folder / "config.json").is_file():
        return None, Issue(field, path, "no config.json here: the checks against the model's head counts were "
                                        "skipped (they run at launch, on the worker)", severity="warning")
    try:
        return model_info(folder), None
    except ModelPathError as exc:
        return None, Issue(field, path, f"{exc}: the checks against the model's head counts were skipped",
                           severity="warning")


def preview(spec: RunSpec, environment: Environment, *, model_roots: list[Path] | None = None) -> Preview:
    """Per role what will run and why on ``environment``, and every problem a launch would refuse."""
    actor, actor_note = _model(spec.actor_rollout_ref.model.path, "actor_rollout_ref.model.path", model_roots)
    critic, critic_note = (_model(spec.critic.model.path, "critic.model.path", model_roots)
                           if spec.has_critic else (None, None))
    issues = check_spec(spec, actor_model=actor, critic_model=critic)
    issues += [n for n in (actor_note, critic_note) if n is not None]
    issues.sort(key=lambda i: i.severity != "error")
    return Preview(resolution=resolve(spec, environment, actor_model=actor, critic_model=critic), issues=issues)
