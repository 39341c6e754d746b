"""Stateless helpers: the resolution preview and verl import. They change nothing, but like every
non-GET endpoint they need a token (the read scope suffices)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ConfigDict, Field

from app.deps import ModelRoots, SettingsDep, require_token
from app.models import EXAMPLE_SPEC, _Request
from app.services import interop

router = APIRouter(prefix="/api", tags=["tools"])


class ResolveRequest(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # type: ignore[assignment]
        {"spec": EXAMPLE_SPEC, "environment": "cuda-sm75"}]})

    spec: dict[str, Any] = Field(description="A run spec, nested or dotted keys.")
    environment: str | dict[str, Any] = Field(
        "cpu", description="A profile name (cpu, cuda-sm75, cuda-sm80-fa2, cuda-sm90-fa2, npu) or a probe result."
    )


class ImportRequest(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [  # type: ignore[assignment]
        {"text": "python3 -m verl.trainer.main_ppo trainer.device=cpu data.train_batch_size=4 "
                 "+critic.model.override_config.attn_implementation=eager", "format": "cli"}]})

    text: str = Field(description="A verl command line or a verl YAML config.")
    format: interop.ImportFormat = Field("auto", description="cli, yaml, or auto (detected from the text).")


@router.post("/resolve", dependencies=[Depends(require_token)])
def resolve(body: ResolveRequest, roots: ModelRoots, settings: SettingsDep) -> dict[str, Any]:
    """Per role: requested, source, effective, status and reasons, on the given environment; and every
    issue a launch would refuse (Ulysses sizes against the model's heads when its folder is readable)."""
    return interop.resolve_preview(spec=body.spec, environment=body.environment,
                                   model_roots=roots, roots=settings.roots)


@router.post("/import", dependencies=[Depends(require_token)])
def import_config(request: Request, body: ImportRequest) -> dict[str, Any]:
    """A verl command line or YAML -> spec + warnings. Errors name the offending token and its position. The text
    is read in a child process: past ``ATTNBOARD_IMPORT_TIMEOUT_S`` the import answers 422 ``import_timeout``."""
    return interop.import_isolated(request.app.state.imports, text=body.text, format=body.format)
