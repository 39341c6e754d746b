"""``RunSpec``: a PPO run, the fields of ``worker.spec.schema`` with the pass-through's check, and its views.

Pure logic, no I/O."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from worker.spec.keys import flatten
from worker.spec.passthrough import split_passthrough
from worker.spec.schema import RunSpecFields


class RunSpec(RunSpecFields):
    """A PPO run. Defaults are verl 0.9.1's, so an imported command means what verl would run."""

    @field_validator("verl_passthrough")
    @classmethod
    def _canonical_passthrough(cls, value: dict[str, Any]) -> dict[str, Any]:
        lifted, passthrough, issues = split_passthrough(value)
        if issues:
            raise ValueError("; ".join(f"{i.field}: {i.message}" for i in issues))
        if lifted:
            raise ValueError(f"{', '.join(lifted)}: modelled by attnboard; set {'them' if len(lifted) > 1 else 'it'} "
                             "in the spec, not in verl_passthrough")
        return passthrough


def spec_to_tree(spec: RunSpec) -> dict[str, Any]:
    """The spec as plain nested data (enums as strings), JSON and YAML safe."""
    return spec.model_dump(mode="json")


def spec_to_flat(spec: RunSpec) -> dict[str, Any]:
    """The spec as dotted keys, with override_config sub-keys expanded (verl's command-line form)."""
    return flatten(spec_to_tree(spec))
