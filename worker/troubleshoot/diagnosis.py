"""The classifier's vocabulary and its answer: what went wrong (``Category``), where in the seed's
troubleshooting order it stops the user (``Step``), the error as text (``ErrorInfo``) and the ``Diagnosis``
with its ``Remedy``. Pure."""

from __future__ import annotations

import re
import traceback as _traceback
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Category(str, Enum):
    """What went wrong, in the terms a user can act on."""

    flash_attn_not_installed = "flash_attn_not_installed"
    flash_attn_version = "flash_attn_version"  # too old, or built for another torch/CUDA (undefined symbol)
    flash_attn_dtype = "flash_attn_dtype"  # FlashAttention asked to run in fp32 (it takes fp16/bf16 only)
    unsupported_hardware = "unsupported_hardware"  # pre-Ampere GPU, compute capability too low
    not_on_cpu = "not_on_cpu"  # flash attention asked for on a machine without a GPU
    architecture_unsupported = "architecture_unsupported"  # the model class lacks FA2 / sdpa / flex
    head_dim = "head_dim"  # the model's head dimension is outside the kernel's limits
    forced_by_engine = "forced_by_engine"  # FSDP-Turbo / Ulysses forces eager
    unknown_implementation = "unknown_implementation"
    kernels_missing = "kernels_missing"  # a Hub kernel asked for without the `kernels` package
    hydra_plus_override = "hydra_plus_override"  # a verl command line missing (or misusing) `+`
    out_of_memory = "out_of_memory"
    flex_backward_cpu = "flex_backward_cpu"
    output_attentions_unsupported = "output_attentions_unsupported"
    other = "other"


class Step(str, Enum):
    """The seed's troubleshooting order (SUMMARY.md point 10), first to last."""

    check_compatibility = "check_compatibility"  # does the model (and the engine) support the kernel?
    fall_back_to_eager = "fall_back_to_eager"  # set eager so training goes on (the guide's second step)
    check_hardware = "check_hardware"  # GPU/NPU, CUDA, driver, memory
    read_the_error = "read_the_error"  # the message usually names the supported options

    @property
    def order(self) -> int:
        """1 for the first step of the seed's order, 4 for the last."""
        return list(Step).index(self) + 1


CATEGORY_STEP: dict[Category, Step] = {
    Category.architecture_unsupported: Step.check_compatibility,
    Category.head_dim: Step.check_compatibility,
    Category.forced_by_engine: Step.check_compatibility,
    Category.output_attentions_unsupported: Step.check_compatibility,
    Category.flash_attn_dtype: Step.check_compatibility,
    Category.flash_attn_not_installed: Step.fall_back_to_eager,
    Category.flash_attn_version: Step.fall_back_to_eager,
    Category.kernels_missing: Step.fall_back_to_eager,
    Category.unsupported_hardware: Step.check_hardware,
    Category.not_on_cpu: Step.check_hardware,
    Category.flex_backward_cpu: Step.check_hardware,
    Category.out_of_memory: Step.check_hardware,
    Category.unknown_implementation: Step.read_the_error,
    Category.hydra_plus_override: Step.read_the_error,
    Category.other: Step.read_the_error,
}
"""The step of the seed's order each category belongs to. ``fall_back_to_eager`` sets eager on the
role's setting (``remedies.eager_remedy``, the rule the run page's button and the preflight apply too)."""


@dataclass(frozen=True)
class ErrorInfo:
    """An error as text: the exception type, its message and the formatted traceback (may be empty)."""

    exc_type: str
    message: str
    traceback: str = ""

    @property
    def head(self) -> str:
        """The final line a user sees: ``Type: message``."""
        if self.exc_type and self.message:
            return f"{self.exc_type}: {self.message}"
        return self.exc_type or self.message

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """Type (module-qualified unless a builtin), message and the full chained traceback of ``exc``."""
        kind = type(exc)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        return cls(name, str(exc), "".join(_traceback.format_exception(exc)))

    @classmethod
    def from_traceback_text(cls, text: str) -> ErrorInfo:
        """Parse a traceback as Python prints it: the block after the last ``Traceback`` header's frames is
        ``Type: message`` (the message may span lines). Text without a header is read the same way."""
        lines = text.rstrip("\n").splitlines()
        headers = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
        start = headers[-1] + 1 if headers else 0
        while headers and start < len(lines) and (lines[start][:1].isspace() or not lines[start]):
            start += 1  # frames, source lines and carets are indented
        while not headers and start < len(lines) and lines[start].startswith("#"):
            start += 1
        tail = "\n".join(lines[start:])
        found = _EXCEPTION_LINE.match(tail)
        if not found:
            return cls("", tail, text)
        return cls(found.group("type"), found.group("message") or "", text)


_EXCEPTION_LINE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::[ ]?(?P<message>.*))?\Z", re.DOTALL)


@dataclass(frozen=True)
class Remedy:
    """What to do: ``patch`` maps dotted spec keys to new values (empty when the fix is not a spec change)."""

    patch: dict[str, Any]
    sentence: str


@dataclass(frozen=True)
class Diagnosis:
    """The classifier's answer for one error."""

    category: Category
    implementation: str | None  # the implementation the error is about, when the text names one
    step: Step  # where in the seed's order this error stops the user
    remedy: Remedy
    summary: str  # one line, for a log row
    evidence: str  # the line of the error text that matched
    return_to_fast_path_when: dict[str, Any] | None = None  # CONDITIONS keys; None: nothing to wait for
    role: str | None = None  # the role the remedy patches; None: every role

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form, for events and the troubleshooting log."""
        return {
            "category": self.category.value,
            "implementation": self.implementation,
            "step": self.step.value,
            "remedy": {"patch": dict(self.remedy.patch), "sentence": self.remedy.sentence},
            "summary": self.summary,
            "evidence": self.evidence,
            "return_to_fast_path_when": self.return_to_fast_path_when,
            "role": self.role,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
        """The inverse of ``as_dict`` (a stored log entry back to a Diagnosis)."""
        return cls(
            category=Category(data["category"]),
            implementation=data.get("implementation"),
            step=Step(data["step"]),
            remedy=Remedy(dict(data["remedy"]["patch"]), data["remedy"]["sentence"]),
            summary=data["summary"],
            evidence=data["evidence"],
            return_to_fast_path_when=data.get("return_to_fast_path_when"),
            role=data.get("role"),
        )
