"""A rank's part of a checkpoint: every trained role's model and optimizer state through
``torch.distributed.checkpoint`` (DCP), plus the rank's RNG state. Collective: every rank calls it.

``get_state_dict`` / ``set_state_dict`` (``torch.distributed.checkpoint.state_dict``) give the state of
an FSDP1, an FSDP2 or an unwrapped (world of 1) module and of its optimizer under the module's own
parameter names, whatever the wrapper or the dtype of the parameters; ``dcp.save`` writes each rank's
shards into one folder and ``dcp.load`` reads them back into the shards of the loading world, resharding
when its size differs (a world of 2 resumes as 1 and back). The optimizer state is flattened to one key
per parameter and value (``state.<param>.exp_avg``, ``param_groups.<param>.lr``), so its keys do not
depend on the wrapper either (unflattened, FSDP1's param groups could not load a world of 1's). The
layout around these folders is ``worker.engine.checkpoint``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from worker.engine.checkpoint import RNG_FOLDER


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _trained(roles: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(name, loaded) for name, loaded in roles.items() if loaded.plan.trained]


def save(roles: Mapping[str, Any], folder: Path, *, rank: int, device: str) -> list[str]:
    """Write each trained role to ``folder/<role>`` (DCP), then this rank's RNG state; returns the roles."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    names = []
    for name, loaded in _trained(roles):
        model_state, optim_state = get_state_dict(loaded.module, loaded.optimizer, options=_options())
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / name))
        names.append(name)
    rng_dir = folder / RNG_FOLDER
    rng_dir.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(device), rng_dir / f"rank_{rank}.pt")
    return names


def load(roles: Mapping[str, Any], folder: Path, *, rank: int, device: str, restore_rng: bool) -> list[str]:
    """Read each trained role from ``folder/<role>`` into this rank's shards (model and optimizer); with
    ``restore_rng`` (same world size as the save), this rank's RNG state too. Returns the roles."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    names = []
    for name, loaded in _trained(roles):
        model_state, optim_state = get_state_dict(loaded.module, loaded.optimizer, options=_options())
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(folder / name))
        set_state_dict(loaded.module, loaded.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_options())
        names.append(name)
    if restore_rng:
        set_rng_state(torch.load(folder / RNG_FOLDER / f"rank_{rank}.pt", weights_only=True), device)
    return names


def rng_state(device: str) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device == "cuda" and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: str) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device == "cuda" and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
