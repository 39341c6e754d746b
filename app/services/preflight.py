"""Preflight around ``worker.preflight.preflight``: gathers what needs I/O (each model folder and data file as
the engine would find them, what the cluster has in all) and runs the preview, for the form's panel,
``POST /api/preflight``, ``POST /api/runs`` (409 on resources the cluster can never offer) and ``attnboard
submit`` (through the API)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.errors import AppError
from app.services.launcher import Launcher
from worker.attention.model_config import BUILTIN_ARCHITECTURES, BUILTIN_PREFIX, ModelPathError, model_folder
from worker.attention.preview import Preview, preview
from worker.core.environment import Environment
from worker.preflight import Facts, Preflight, preflight, resource_findings
from worker.preflight.checks import MODEL_KEYS
from worker.spec import RunSpec

log = logging.getLogger("attnboard.preflight")


def cluster_total(launcher: Launcher | None) -> dict[str, float] | None:
    """What the cluster has in all, or None when there is no launcher or Ray cannot be asked now."""
    ask = getattr(launcher, "cluster_total", None)
    if ask is None:
        return None
    try:
        return ask()
    except Exception as exc:  # Ray down or starting: the resource check is skipped, the launch answers 503
        log.info("preflight: cluster resources unknown: %s", exc)
        return None


def _model_problem(path: str, field: str, roots: list[Path]) -> str | None:
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        return None if name in BUILTIN_ARCHITECTURES else (
            f"unknown built-in preset; valid: {', '.join(BUILTIN_PREFIX + n for n in BUILTIN_ARCHITECTURES)}")
    try:
        model_folder(path, roots, field=field)
    except ModelPathError as exc:
        return str(exc)
    return None


def _data_problem(name: str) -> str | None:
    if name.startswith(BUILTIN_PREFIX):
        return None
    if not Path(name).expanduser().is_file():
        return (f"data.train_files {name!r} does not exist on the app's node, or is not a file (a verl-format parquet "
                f"file, or a built-in task such as builtin:count)")
    return None


def gather_facts(spec: RunSpec, *, model_roots: list[Path], launcher: Launcher | None) -> Facts:
    paths = {MODEL_KEYS[0]: spec.actor_rollout_ref.model.path, MODEL_KEYS[1]: spec.critic.model.path}
    models = {key: why for key, path in paths.items() if (why := _model_problem(path, key, model_roots))}
    files = spec.data.train_files if isinstance(spec.data.train_files, list) else [spec.data.train_files]
    data = {name: why for name in files if (why := _data_problem(name))}
    return Facts(model_problems=models, data_problems=data, cluster_total=cluster_total(launcher))


def check(spec: RunSpec, environment: Environment, *, model_roots: list[Path], launcher: Launcher | None,
          shown: Preview | None = None) -> Preflight:
    """Every finding of this launch on ``environment`` (``shown``: its preview when the caller has it)."""
    shown = shown or preview(spec, environment, model_roots=model_roots)
    return preflight(spec, environment, issues=shown.issues, resolution=shown.resolution,
                     facts=gather_facts(spec, model_roots=model_roots, launcher=launcher))


def refuse_never_fits(spec: RunSpec, launcher: Launcher | None) -> None:
    """409 naming the resources when the cluster can never offer what the run's ranks ask for (a launch
    that would wait forever); nothing when it fits or the cluster is not known."""
    device: Any = spec.trainer.device
    found = resource_findings(spec, str(getattr(device, "value", device)), cluster_total(launcher))
    if found:
        f = found[0]
        raise AppError(409, "never_fits", f"{f.key}: {f.problem}", field=f.key, value=f.value,
                       valid=f"at most {f.suggested}" if f.suggested is not None else "a cluster with these resources")
