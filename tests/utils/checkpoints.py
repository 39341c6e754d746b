"""Checkpoint folders on disk in ``worker.engine.checkpoint``'s layout, for tests of the layout, the API and the
pages (the DCP contents are the engine's: role folders hold a shard and the ``.metadata`` DCP leaves)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worker.engine import checkpoint


def write_checkpoint(folder: Path, step: int, *, run_id: str = "r1", roles: Sequence[str] = ("actor", "critic"),
                     trained: Sequence[str] = ("actor", "critic"), marker: bool = True, metadata: bool = True,
                     **meta: Any) -> Path:
    """``folder/global_step_<step>`` with ``roles`` present; ``marker=False`` or ``metadata=False`` leave it as
    an interrupted write leaves it."""
    path = checkpoint.step_folder(folder, step)
    for role in roles:
        (path / role).mkdir(parents=True)
        (path / role / "__0_0.distcp").write_bytes(b"x" * 100)
        if metadata:
            (path / role / checkpoint.DCP_METADATA).write_bytes(b"m")
    path.mkdir(parents=True, exist_ok=True)
    if marker:
        (path / checkpoint.MARKER).write_text(json.dumps({"step": step, "run_id": run_id, "roles": list(trained),
                                                          "saved_at": "2026-12-04T10:00:00+00:00", **meta}))
    return path


def full_weights(step_folder: Path, roles: Sequence[str] = ("actor", "critic")) -> dict[str, dict[str, Any]]:
    """The full model state of each role in a checkpoint the engine wrote, read without a process group."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = {}
    for role in roles:
        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(step_folder / role, Path(tmp) / "full.pt")
            out[role] = torch.load(Path(tmp) / "full.pt", weights_only=True)["model"]
    return out


def assert_same_weights(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> None:
    """Equal within fp32 tolerance, role by role and parameter by parameter."""
    import torch

    assert a.keys() == b.keys()
    for role in a:
        assert a[role].keys() == b[role].keys()
        for name in a[role]:
            torch.testing.assert_close(a[role][name], b[role][name], msg=lambda m, role=role, name=name: f"{role} {name}: {m}")
