"""Back to the fast path: the conditions a later probe of the node must meet for the cause of a failure
to be gone, and the patch and sentence that suggest returning. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from worker.attention.availability import FLASH_MIN_COMPUTE_CAPABILITY, version_tuple
from worker.core.environment import Environment
from worker.core.implementations import DEFAULT_IMPL, Impl, is_hub_kernel
from worker.troubleshoot.diagnosis import Diagnosis
from worker.troubleshoot.remedies import attn_patch, shown


def _cc_ok(env: Environment, want: Any) -> bool:
    return env.compute_capability is not None and tuple(env.compute_capability) >= tuple(want)


CONDITIONS: dict[str, Callable[[Environment, Any], bool]] = {
    "flash_attn_installed": lambda env, want: env.flash_attn_installed == bool(want),
    "min_flash_attn_version": lambda env, want: (
        env.flash_attn_version is not None and version_tuple(env.flash_attn_version) >= version_tuple(str(want))),
    "flash_attn_version_not": lambda env, old: env.flash_attn_version is not None and env.flash_attn_version != old,
    "min_compute_capability": _cc_ok,
    "device": lambda env, want: env.device == want,
    "kernels_installed": lambda env, want: env.kernels_installed == bool(want),
}
"""The keys ``return_to_fast_path_when`` may hold, each checked against a later probe. A compute
capability condition fails on a node without one (CPU, NPU)."""


def conditions_met(when: Mapping[str, Any], env: Environment) -> bool:
    """Whether every condition holds on ``env``; an unknown key is an error naming the valid ones."""
    for key, want in when.items():
        if key not in CONDITIONS:
            raise ValueError(f"return_to_fast_path_when.{key}: unknown condition; valid: {', '.join(CONDITIONS)}")
        if not CONDITIONS[key](env, want):
            return False
    return True


def fast_path_implementation(diagnosis: Diagnosis) -> str:
    """The implementation to return to: the fast one that failed, else the default (flash_attention_2)."""
    impl = diagnosis.implementation
    fast = impl is not None and (impl in FLASH_MIN_COMPUTE_CAPABILITY or impl == Impl.flex_attention.value
                                 or is_hub_kernel(impl))
    return impl if fast else DEFAULT_IMPL


def fast_path_patch(diagnosis: Diagnosis) -> dict[str, str]:
    """The spec patch that goes back to the fast path for the diagnosis' role(s)."""
    return attn_patch(diagnosis.role, fast_path_implementation(diagnosis))


def suggest_return_to_fast_path(diagnosis: Diagnosis, env: Environment) -> str | None:
    """A sentence suggesting the return to the fast path when ``env`` (a later probe) shows the cause gone;
    None when the diagnosis has no such condition or it does not hold yet."""
    when = diagnosis.return_to_fast_path_when
    if not when or not conditions_met(when, env):
        return None
    impl = fast_path_implementation(diagnosis)
    facts = [f"device {env.device}"]
    if env.compute_capability is not None:
        facts.append(f"compute capability {env.compute_capability[0]}.{env.compute_capability[1]}")
    if env.flash_attn_version is not None:
        facts.append(f"flash-attn {env.flash_attn_version}")
    if env.kernels_installed:
        facts.append("kernels installed")
    return (f"The cause of the earlier {diagnosis.category.value} failure is gone ({', '.join(facts)}): "
            f"return to {impl} with {shown(fast_path_patch(diagnosis))}.")
