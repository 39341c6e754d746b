"""Attention implementation names, as transformers 5.x accepts them.

Pure: no imports beyond the standard library, so the app, the CLI and the worker share it.
"""

from __future__ import annotations

import re
from enum import Enum


class Impl(str, Enum):
    """The implementations attnboard reasons about by name."""

    eager = "eager"
    sdpa = "sdpa"
    flash_attention_2 = "flash_attention_2"
    flash_attention_3 = "flash_attention_3"
    flash_attention_4 = "flash_attention_4"
    flex_attention = "flex_attention"


DEFAULT_IMPL = Impl.flash_attention_2.value
"""verl's default when `override_config.attn_implementation` is absent (HFModelConfig)."""

BUILTIN_NAMES: tuple[str, ...] = tuple(i.value for i in Impl)
PAGED_NAMES: tuple[str, ...] = tuple(f"paged|{name}" for name in BUILTIN_NAMES)
VALID_NAMES: tuple[str, ...] = BUILTIN_NAMES + PAGED_NAMES

# The fallback chain of the `fallback` policy: fastest first, plainest last.
FALLBACK_CHAIN: tuple[str, ...] = (Impl.flash_attention_2.value, Impl.sdpa.value, Impl.eager.value)

ULYSSES_BASES: tuple[str, ...] = (Impl.eager.value, Impl.sdpa.value)
"""Kernels attnboard's Ulysses wrapper runs on (they accept an explicit 4D additive mask)."""

# `org/repo[@revision][:function]`, the transformers 5.x syntax for a kernel from the Hub.
_HUB_KERNEL = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*)"
    r"(?:@(?P<rev>[A-Za-z0-9_.\-/]+))?"
    r"(?::(?P<fn>[A-Za-z_][A-Za-z0-9_]*))?$"
)

VALID_DESCRIPTION = ", ".join(BUILTIN_NAMES) + ", paged|<name>, or a Hub kernel org/repo[@rev][:fn]"


def is_hub_kernel(name: str) -> bool:
    return bool(_HUB_KERNEL.match(name))


def is_valid_name(name: str) -> bool:
    return name in VALID_NAMES or is_hub_kernel(name)


def base_impl(name: str) -> str:
    """The kernel family behind a name: `paged|sdpa` runs sdpa; a hub kernel stays itself."""
    return name.split("|", 1)[1] if name.startswith("paged|") else name
