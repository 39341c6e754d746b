"""The troubleshooting classifier: from an error (and what is known of the node) to a diagnosis and a remedy.

Pure: no I/O. ``classify(error, env, role=...)`` matches the error's text against an ordered table of
rules (``RULES``), first match wins, and returns a ``Diagnosis``: a ``Category``, the step of the seed's
troubleshooting order it belongs to (check compatibility -> fall back to eager -> check hardware -> read
the error), a ``Remedy`` (a patch of dotted spec keys plus one sentence) and the condition under which a
later probe shows the cause gone, so the app can suggest returning to the fast path
(``suggest_return_to_fast_path``).

The messages recognised are those in ATTENTION_RULES.md, in transformers 4.x and 5.x wording, plus the
exact strings of transformers 5.24 (``modeling_utils._flash_attn_import_error``,
``_flash_attn_can_dispatch``, ``_sdpa_can_dispatch``, ``get_correct_attn_implementation``,
``integrations/hub_kernels.py``), flash-attn's own kernel errors, torch's flex-attention and allocator
errors, and Hydra's struct-mode override errors.

The remedy follows the seed: start from the default (flash_attention_2), degrade one step at a time
along the one fallback chain (``worker.attention.availability.fallback_target``: the next candidate of the failed
implementation's chain that the node, when known, can run, given what the error taught, e.g. that the model
has no flash kernel), and return to the fast path once the cause is fixed.
"""

from __future__ import annotations

import difflib
import re
import traceback as _traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from worker.attention.availability import (
    FLASH_MIN_COMPUTE_CAPABILITY,
    Context,
    ModelSupport,
    candidates,
    fallback_target,
    unavailable,
    version_tuple,
)
from worker.attention.kernel_sources import HUB_FLASH_KERNELS
from worker.core.environment import Environment
from worker.core.implementations import BUILTIN_NAMES, DEFAULT_IMPL, Impl, is_hub_kernel

# --------------------------------------------------------------------------------------------
# Vocabulary


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
    fall_back_to_eager = "fall_back_to_eager"  # degrade one step (fa2 -> sdpa -> eager) so training goes on
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
"""The step of the seed's order each category belongs to. ``fall_back_to_eager`` means "degrade one step
along the fallback chain": a missing flash-attn goes to sdpa first, a failing sdpa to eager."""

ROLE_SECTIONS: dict[str, str] = {
    "actor": "actor_rollout_ref",
    "rollout": "actor_rollout_ref",
    "reference": "actor_rollout_ref",
    "ref": "actor_rollout_ref",
    "critic": "critic",
}
"""Where each role's attention is configured (ATTENTION_RULES.md: actor, rollout and reference share one key)."""

ATTN_KEY = "{section}.model.override_config.attn_implementation"
ACTOR_SP_KEY = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
DTYPE_KEYS: dict[str, tuple[str, ...]] = {
    "actor_rollout_ref": ("actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.ref.fsdp_config.dtype",
                          "actor_rollout_ref.rollout.dtype"),
    "critic": ("critic.fsdp.dtype",),
}
"""The compute-dtype keys (verl's) per section: actor, reference and rollout share one model."""
HALF_DTYPE = "bfloat16"
"""What the dtype remedy sets: verl's default compute dtype."""

# --------------------------------------------------------------------------------------------
# Inputs


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

DEVICES = ("cpu", "cuda", "npu")


@dataclass(frozen=True)
class EnvFacts:
    """The few facts about a node the classifier uses.

    Field names match ``worker.core.environment.Environment``, so ``EnvFacts.of(environment)`` adapts one (or a
    probe dict) and ``environment()`` goes back, for the availability check. ``compute_capability`` is
    ``(major, minor)`` on CUDA, else None; ``flash_attn_version`` is None when flash-attn is not importable.
    """

    device: str
    compute_capability: tuple[int, int] | None = None
    flash_attn_version: str | None = None
    transformers_version: str = "5.24.0"
    kernels_installed: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"EnvFacts.device: {self.device!r} is not valid; valid: {', '.join(DEVICES)}")
        cc = self.compute_capability
        if cc is not None and (len(cc) != 2 or not all(isinstance(x, int) for x in cc)):
            raise ValueError(f"EnvFacts.compute_capability: {cc!r} must be (major, minor), e.g. (8, 0)")

    @property
    def flash_attn_installed(self) -> bool:
        return self.flash_attn_version is not None

    @property
    def transformers_major(self) -> int:
        parts = version_tuple(self.transformers_version)
        return parts[0] if parts else 5

    def environment(self) -> Environment:
        """The same facts as a ``worker.core.environment.Environment``, for the availability check."""
        return Environment(name="node", device=self.device, compute_capability=self.compute_capability,
                           flash_attn_version=self.flash_attn_version, transformers_version=self.transformers_version,
                           kernels_installed=self.kernels_installed)

    @classmethod
    def of(cls, env: Any) -> EnvFacts:
        """From any object or mapping with these field names (a probe dict, the lead's ``Environment``)."""
        get = env.get if isinstance(env, Mapping) else lambda name, default=None: getattr(env, name, default)
        cc = get("compute_capability", None)
        return cls(
            device=get("device", "cpu"),
            compute_capability=tuple(cc) if cc is not None else None,
            flash_attn_version=get("flash_attn_version", None),
            transformers_version=get("transformers_version", "5.24.0"),
            kernels_installed=bool(get("kernels_installed", False)),
        )


# --------------------------------------------------------------------------------------------
# Output


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


# --------------------------------------------------------------------------------------------
# Helpers shared by the rules


@dataclass(frozen=True)
class _Context:
    error: ErrorInfo
    env: EnvFacts | None
    role: str | None
    match: re.Match[str]


def attn_patch(role: str | None, impl: str) -> dict[str, str]:
    """The spec patch setting ``impl`` for a role (both sections when role is None)."""
    sections = sorted(set(ROLE_SECTIONS.values())) if role is None else [ROLE_SECTIONS[role]]
    return {ATTN_KEY.format(section=section): impl for section in sections}


def _who(role: str | None) -> str:
    if role is None:
        return "every role"
    if role == "critic":
        return "the critic"
    return "the actor, rollout and reference (they share one key)"


def _shown(patch: Mapping[str, Any]) -> str:
    return " and ".join(f"{key}={value}" for key, value in patch.items())


def _node(ctx: _Context, env: EnvFacts | None = None, **learned: Any) -> Context:
    """The availability context of the role that failed: the node (``env`` when the error itself tells it,
    else the one known; None: unknown, assumed able) and ``learned``, the ``Context`` facts the error taught
    (``support=``, ``sp=``, ``output_attentions=``)."""
    node = env or ctx.env
    return Context(node.environment() if node else None, trained=ctx.role not in ("reference", "ref"), **learned)


def _next(ctx: _Context, failed: str | None, env: EnvFacts | None = None, **learned: Any) -> str:
    """The implementation to set after ``failed``: the next one of its fallback chain that the node can run
    (``worker.attention.availability.fallback_target``)."""
    return fallback_target(failed, _node(ctx, env, **learned))


NO_FLASH = ModelSupport("the model", flash_attn=False)
"""What an error about a flash kernel's own limit (a broken build, the head dimension) teaches: no flash
kernel can run this model here."""


def _support_without(model: str, impl: str | None) -> ModelSupport:
    """What "``model`` does not support ``impl``" teaches (transformers has one flag for every flash kernel)."""
    if impl in (Impl.sdpa.value, Impl.flex_attention.value):
        return ModelSupport(model, sdpa=impl != Impl.sdpa.value, flex_attn=impl != Impl.flex_attention.value)
    return ModelSupport(model, flash_attn=False)


# Where to look for the implementation an error is about, most specific first.
_IMPL_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"attn_implementation\s*=\s*[\"'`]?(?P<name>[A-Za-z0-9_|./@:\-]*[A-Za-z0-9_])"), lambda m: m["name"]),
    (re.compile(r"Flash ?Attention ?(?P<v>\d)", re.I), lambda m: f"flash_attention_{m['v']}"),
    (re.compile(r"flash_attn_interface"), lambda m: Impl.flash_attention_3.value),
    (re.compile(r"flash[_ ]?attn|flash_attention|FlashAttention|Flash Attention", re.I),
     lambda m: Impl.flash_attention_2.value),
    (re.compile(r"scaled_dot_product_attention|sdpa_attention_forward|\bsdpa\b"), lambda m: Impl.sdpa.value),
    (re.compile(r"flex_attention|FlexAttention"), lambda m: Impl.flex_attention.value),
    (re.compile(r"eager_attention_forward"), lambda m: Impl.eager.value),
)


def _impl_in(text: str) -> str | None:
    for pattern, name in _IMPL_PATTERNS:
        found = pattern.search(text)
        if found:
            return name(found)
    return None


def _implementation(ctx: _Context) -> str | None:
    """The implementation involved: from the matched excerpt, else the start of its line (the subject of
    "... does not support ..."), else the message, else the traceback."""
    text = ctx.match.string
    subject = text[text.rfind("\n", 0, ctx.match.start()) + 1: ctx.match.start()]
    for place in (ctx.match.group(0), subject, ctx.error.head, ctx.error.traceback):
        impl = _impl_in(place)
        if impl:
            return impl
    return None


def _flash_impl(ctx: _Context) -> str:
    impl = _implementation(ctx)
    return impl if impl in FLASH_MIN_COMPUTE_CAPABILITY else Impl.flash_attention_2.value


def _min_cc(impl: str) -> list[int]:
    return list(FLASH_MIN_COMPUTE_CAPABILITY.get(impl, (8, 0)))


def _evidence(ctx: _Context) -> str:
    """The line of text holding the match (the whole match when it spans lines), at most 400 characters."""
    text = ctx.match.string
    start = text.rfind("\n", 0, ctx.match.start()) + 1
    end = text.find("\n", ctx.match.end())
    line = text[start: end if end >= 0 else len(text)].strip()
    return line if len(line) <= 400 else line[:397] + "..."


def _diagnosis(
    ctx: _Context,
    category: Category,
    *,
    impl: str | None,
    patch: dict[str, Any],
    sentence: str,
    summary: str,
    return_when: dict[str, Any] | None = None,
    role: str | None = None,
) -> Diagnosis:
    return Diagnosis(
        category=category,
        implementation=impl,
        step=CATEGORY_STEP[category],
        remedy=Remedy(patch, sentence),
        summary=summary,
        evidence=_evidence(ctx),
        return_to_fast_path_when=return_when,
        role=role if role is not None else ctx.role,
    )


# --------------------------------------------------------------------------------------------
# Builders: one per kind of fix. Each reads the match and the environment, never the raw strings again.


def _hydra_plus(ctx: _Context) -> Diagnosis:
    m = ctx.match
    key = m["key"]
    role = ctx.role or ("critic" if key.startswith("critic.") else "actor" if key.startswith("actor_rollout_ref.")
                        else None)
    argument = m.groupdict().get("append")
    if argument:
        value = argument.partition("=")[2]
        fix = f"+{argument}"
        sentence = (f"Hydra's struct mode rejects keys the config does not declare: write {fix} "
                    f"(or ++{argument} to add or replace) on the verl command line; the spec itself is fine.")
        summary = f"verl command line: {key} needs the + prefix"
    else:
        existing = m["existing"]
        value = existing.partition("=")[2]
        sentence = (f"{key} already exists in verl's config: drop the + and write {existing} "
                    f"(or ++{existing}) on the verl command line; the spec itself is fine.")
        summary = f"verl command line: {key} exists, so it takes no + prefix"
    impl = value if key.endswith("attn_implementation") and value else None
    return _diagnosis(ctx, Category.hydra_plus_override, impl=impl, patch={}, sentence=sentence,
                      summary=summary, role=role)


_LISTED_NAME = re.compile(r"[\"=](?P<name>(?:paged\|)?(?:eager|sdpa|flex_attention|flash_attention_\d))[\"`]")

# Short names people type, mapped to what they mean; used to read a typo like "flsh" as flash_attention_2.
_ALIASES: dict[str, str] = {name: name for name in BUILTIN_NAMES} | {
    "flash": "flash_attention_2", "fa2": "flash_attention_2", "flash_attn": "flash_attention_2",
    "flash_attn_2": "flash_attention_2", "flash_attention": "flash_attention_2", "fa3": "flash_attention_3",
    "fa4": "flash_attention_4", "flex": "flex_attention", "math": "eager", "manual": "eager",
}


def _unknown_name(ctx: _Context) -> Diagnosis:
    typed = ctx.match["name"]
    listed = list(dict.fromkeys(m["name"] for m in _LISTED_NAME.finditer(ctx.error.head))) or list(BUILTIN_NAMES)
    meant = difflib.get_close_matches(typed.lower(), list(_ALIASES), n=1, cutoff=0.6)
    guess = _ALIASES[meant[0]] if meant else None
    node = _node(ctx)

    def usable(name: str | None) -> bool:  # listed by the model, and the node (when known) can run it
        return name in listed and unavailable(name, node) is None

    target = guess if usable(guess) else next((n for n in candidates(DEFAULT_IMPL, "fallback") if usable(n)),
                                              Impl.eager.value)
    patch = attn_patch(ctx.role, target)
    meaning = f' (probably "{guess}")' if guess else ""
    sentence = (f'"{typed}"{meaning} is not an attention implementation this model accepts '
                f"({', '.join(listed)}): set {_shown(patch)}.")
    return _diagnosis(ctx, Category.unknown_implementation, impl=typed, patch=patch, sentence=sentence,
                      summary=f'unknown attention implementation "{typed}"')


_HUB_NAME = re.compile(r"[\"'`](?P<name>[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*(?:@[\w.\-/]+)?(?::\w+)?)[\"'`]")


def _kernels_missing(ctx: _Context) -> Diagnosis:
    names = [m["name"] for m in _HUB_NAME.finditer(f"{ctx.error.head}\n{ctx.error.traceback}")]
    kernel = next((name for name in names if is_hub_kernel(name) and "site-packages" not in name), None)
    patch = attn_patch(ctx.role, _next(ctx, kernel))
    asked = kernel or "a Hub kernel"
    sentence = (f"{kernel or 'A Hub kernel'} needs the `kernels` package: set {_shown(patch)} so {_who(ctx.role)} trains now, "
                f"then pip install kernels (the version the message names) and return to {kernel or 'the kernel'}.")
    return _diagnosis(ctx, Category.kernels_missing, impl=kernel, patch=patch, sentence=sentence,
                      summary=f"{asked} requested but `kernels` is not installed",
                      return_when={"kernels_installed": True})


def _flash_version(ctx: _Context) -> Diagnosis:
    impl = _flash_impl(ctx)
    patch = attn_patch(ctx.role, _next(ctx, impl, support=NO_FLASH))  # the flash-attn package is unusable here
    minimum = ctx.match.groupdict().get("min")
    if minimum:
        found = f" (found {ctx.env.flash_attn_version})" if ctx.env and ctx.env.flash_attn_version else ""
        sentence = (f"flash-attn is older than {impl} needs{found}: set {_shown(patch)} so {_who(ctx.role)} "
                    f"trains now, then upgrade to flash-attn >= {minimum} and return to {impl}.")
        summary = f"flash-attn older than {minimum}"
        when: dict[str, Any] | None = {"min_flash_attn_version": minimum, "min_compute_capability": _min_cc(impl)}
    else:
        sentence = (f"flash-attn is installed but was built for another torch or CUDA: set {_shown(patch)} so "
                    f"{_who(ctx.role)} trains now, then reinstall it against this torch "
                    f"(pip install --force-reinstall --no-build-isolation flash-attn) and return to {impl}.")
        summary = "flash-attn binary does not match this torch/CUDA (ABI mismatch)"
        before = ctx.env.flash_attn_version if ctx.env else None
        when = {"flash_attn_version_not": before, "min_compute_capability": _min_cc(impl)} if before else None
    return _diagnosis(ctx, Category.flash_attn_version, impl=impl, patch=patch, sentence=sentence,
                      summary=summary, return_when=when)


HUB_FETCH_EVIDENCE = re.compile(r"from the `kernels` library instead|kernels-community/|We couldn't connect to '"
                                r"https://huggingface\.co'|LocalEntryNotFoundError|HF_HUB_OFFLINE|hub_kernels\.py")
"""In an ImportError's traceback: transformers tried a Hub kernel (``worker.attention.kernel_sources``) first."""


def _flash_not_installed(ctx: _Context) -> Diagnosis:
    impl = _flash_impl(ctx)
    cc = _min_cc(impl)
    target = _next(ctx, impl)
    patch = attn_patch(ctx.role, target)
    env = ctx.env
    if HUB_FETCH_EVIDENCE.search(ctx.error.traceback) and impl in HUB_FLASH_KERNELS:
        # transformers 5.24 with `kernels` and without flash-attn fetches a Hub kernel first; when the node cannot
        # reach the Hub it re-raises the package check, so this message hides the real cause.
        repo = HUB_FLASH_KERNELS[impl]
        sentence = (f"flash-attn is not installed, and transformers' fallback, {repo} from the Hugging Face Hub via "
                    f"`kernels`, could not be fetched (an offline node): set {_shown(patch)} so {_who(ctx.role)} "
                    f"trains on {target} now, then fetch {repo} into the HF cache the node reads where the Hub is "
                    f"reachable and run with HF_HUB_OFFLINE=1, or pip install flash-attn, and return to {impl}.")
        return _diagnosis(ctx, Category.flash_attn_not_installed, impl=impl, patch=patch, sentence=sentence,
                          summary=f"{impl}: flash-attn missing and the Hub kernel {repo} unreachable",
                          return_when={"flash_attn_installed": True, "min_compute_capability": cc})
    if env is not None and (env.device == "cpu" or (env.compute_capability or (99, 0)) < tuple(cc)):
        where = "this machine cannot run it either" if env.device == "cpu" else (
            f"this GPU (compute capability {env.compute_capability[0]}.{env.compute_capability[1]}) cannot run it either")
        then = f"move to a GPU with compute capability >= {cc[0]}.{cc[1]} and flash-attn installed"
    else:
        where = ""
        then = f"pip install flash-attn --no-build-isolation on a GPU with compute capability >= {cc[0]}.{cc[1]}"
    sentence = (f"flash-attn is not installed{where and ' and ' + where}: set {_shown(patch)} so {_who(ctx.role)} "
                f"trains on {target} now, then {then} and return to {impl}.")
    return _diagnosis(ctx, Category.flash_attn_not_installed, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} requested but flash-attn is not installed",
                      return_when={"flash_attn_installed": True, "min_compute_capability": cc})


def _not_on_cpu(ctx: _Context) -> Diagnosis:
    impl = _flash_impl(ctx)
    cc = _min_cc(impl)
    patch = attn_patch(ctx.role, _next(ctx, impl, env=EnvFacts("cpu")))  # the error says: a CPU
    sentence = (f"{impl} runs only on a CUDA GPU (compute capability >= {cc[0]}.{cc[1]}) or an Ascend NPU: "
                f"set {_shown(patch)} to train on this CPU, and return to {impl} on such a GPU with flash-attn.")
    return _diagnosis(ctx, Category.not_on_cpu, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} requested on a machine without a GPU",
                      return_when={"flash_attn_installed": True, "min_compute_capability": cc})


def _unsupported_hardware(ctx: _Context) -> Diagnosis:
    impl = _implementation(ctx)
    flash = impl if impl in FLASH_MIN_COMPUTE_CAPABILITY else None
    major = ctx.match.groupdict().get("major")
    cc = [int(major), 0] if major else _min_cc(flash or Impl.flash_attention_2.value)
    found = ""
    if ctx.env is not None and ctx.env.compute_capability is not None:
        found = f" (this one is {ctx.env.compute_capability[0]}.{ctx.env.compute_capability[1]})"
    if flash is None:
        sentence = (f"This GPU{found} is not supported by a compiled kernel in use: check the GPU, driver and that "
                    f"torch and flash-attn were built for its architecture, and use eager to find the failing kernel.")
        return _diagnosis(ctx, Category.unsupported_hardware, impl=impl, patch={}, sentence=sentence,
                          summary="no kernel built for this GPU architecture")
    patch = attn_patch(ctx.role, _next(ctx, flash))
    sentence = (f"{flash} needs a GPU with compute capability >= {cc[0]}.{cc[1]}{found}: set {_shown(patch)} "
                f"on this GPU, and return to {flash} on a GPU that has it.")
    return _diagnosis(ctx, Category.unsupported_hardware, impl=flash, patch=patch, sentence=sentence,
                      summary=f"{flash} needs compute capability >= {cc[0]}.{cc[1]}",
                      return_when={"flash_attn_installed": True, "min_compute_capability": cc})


def _head_dim(ctx: _Context) -> Diagnosis:
    impl = _flash_impl(ctx)
    patch = attn_patch(ctx.role, _next(ctx, impl, support=NO_FLASH))
    sentence = (f"This model's head dimension is outside what the flash-attn kernel supports: "
                f"set {_shown(patch)} for this model; {impl} cannot run it.")
    return _diagnosis(ctx, Category.head_dim, impl=impl, patch=patch, sentence=sentence,
                      summary=f"head dimension unsupported by {impl}")


def _architecture(ctx: _Context) -> Diagnosis:
    impl = ctx.match.groupdict().get("kernel") or _implementation(ctx)
    model = ctx.match.groupdict().get("model") or "This model"
    target = _next(ctx, impl, support=_support_without(model, impl))
    patch = attn_patch(ctx.role, target)
    further = f", and go on to eager if {target} is refused too" if target != Impl.eager.value else ""
    sentence = f"{model} has no {impl} implementation: set {_shown(patch)} (one step down from {impl}){further}."
    return _diagnosis(ctx, Category.architecture_unsupported, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{model} does not support {impl}")


def _flex_backward(ctx: _Context) -> Diagnosis:
    impl = Impl.flex_attention.value
    patch = attn_patch(ctx.role, _next(ctx, impl, env=EnvFacts("cpu")))  # the error says: a CPU
    sentence = (f"flex_attention cannot train on CPU (no backward there): set {_shown(patch)} to train on "
                f"this CPU, and return to flex_attention on a GPU.")
    return _diagnosis(ctx, Category.flex_backward_cpu, impl=impl, patch=patch, sentence=sentence,
                      summary="flex_attention has no backward pass on CPU", return_when={"device": "cuda"})


def _output_attentions(ctx: _Context) -> Diagnosis:
    impl = _implementation(ctx)
    patch = attn_patch(ctx.role, _next(ctx, impl, output_attentions=True))
    v4 = ctx.env is not None and ctx.env.transformers_major < 5
    behaviour = "transformers 4.x falls back to eager per call" if v4 else "transformers 5.x returns none, silently"
    sentence = (f"Only eager returns attention weights ({behaviour}): set {_shown(patch)} for the run that needs "
                f"output_attentions, and keep {impl} otherwise.")
    return _diagnosis(ctx, Category.output_attentions_unsupported, impl=impl, patch=patch, sentence=sentence,
                      summary=f"output_attentions=True is not supported by {impl}")


def _forced_conflict(ctx: _Context) -> Diagnosis:
    patch = {ACTOR_SP_KEY: 1}
    sentence = (f"FSDP-Turbo runs its own Ulysses/CP group (and forces eager): set {_shown(patch)}, "
                f"or switch actor_rollout_ref.actor.strategy to fsdp2 to keep verl's Ulysses.")
    return _diagnosis(ctx, Category.forced_by_engine, impl=Impl.eager.value, patch=patch, sentence=sentence,
                      summary="FSDP-Turbo CP and verl Ulysses SP enabled together")


def _forced_eager(ctx: _Context) -> Diagnosis:
    sentence = ("The engine forces eager under FSDP-Turbo with Ulysses sequence parallelism, a required fallback "
                "rather than a configuration conflict: nothing to fix, or use strategy fsdp2 (or "
                f"{ACTOR_SP_KEY}=1) to run a fused kernel.")
    return _diagnosis(ctx, Category.forced_by_engine, impl=Impl.eager.value, patch={}, sentence=sentence,
                      summary="eager forced by FSDP-Turbo with Ulysses sequence parallelism")


def _ulysses_kernel(ctx: _Context) -> Diagnosis:
    impl = ctx.match.group("impl")
    patch = attn_patch(ctx.role, _next(ctx, impl, sp=2))  # the error says: sequence parallelism is on
    sentence = (f"attnboard's Ulysses sequence parallelism wraps eager and sdpa only, not {impl} (verl's own Ulysses "
                f"runs flash_attention_2; attnboard's wrapper does not yet): set {_shown(patch)} (the fastest it "
                f"wraps), or set the sequence-parallel size to 1 to keep {impl}.")
    return _diagnosis(ctx, Category.forced_by_engine, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} cannot run inside Ulysses sequence parallelism")


def dtype_patch(role: str | None, dtype: str = HALF_DTYPE) -> dict[str, str]:
    """The spec patch setting the compute dtype of a role's model (every role when None)."""
    sections = sorted(set(ROLE_SECTIONS.values())) if role is None else [ROLE_SECTIONS[role]]
    return {key: dtype for section in sections for key in DTYPE_KEYS[section]}


def _flash_dtype(ctx: _Context) -> Diagnosis:
    found = ctx.match.groupdict()
    if found.get("v"):  # transformers' load-time warning names the version
        impl = f"flash_attention_{found['v']}"
    elif found.get("fa4"):
        impl = Impl.flash_attention_4.value
    elif found.get("fa3") or found.get("fa3_fp8"):  # only hopper/flash_api.cpp says either
        impl = Impl.flash_attention_3.value
    else:
        impl = _flash_impl(ctx)
    patch = dtype_patch(ctx.role)
    sentence = (f"{impl} computes in fp16/bf16 only and {_who(ctx.role)} computes in float32 (transformers only warns "
                f"at load, the kernel refuses the first forward): set {_shown(patch)}, verl's default (the master "
                f"weights stay in model_dtype), and keep {impl}.")
    return _diagnosis(ctx, Category.flash_attn_dtype, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} asked to compute in float32")


def _out_of_memory(ctx: _Context) -> Diagnosis:
    impl = _implementation(ctx)
    if impl == Impl.eager.value:
        patch = attn_patch(ctx.role, Impl.sdpa.value)
        sentence = (f"Out of memory under eager, which materialises the (T, T) attention scores: set "
                    f"{_shown(patch)}, and lower ppo_micro_batch_size_per_gpu if it still does not fit.")
    else:
        patch = {}
        sentence = ("Out of memory: lower ppo_micro_batch_size_per_gpu (or the sequence lengths), keep gradient "
                    "checkpointing on, or enable fsdp_config.param_offload, then retry.")
    return _diagnosis(ctx, Category.out_of_memory, impl=impl, patch=patch, sentence=sentence,
                      summary="out of memory" + (f" under {impl}" if impl else ""))


# --------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Rule:
    category: Category
    pattern: re.Pattern[str]
    build: Callable[[_Context], Diagnosis]


def _rule(category: Category, pattern: str, build: Callable[[_Context], Diagnosis]) -> Rule:
    return Rule(category, re.compile(pattern, re.IGNORECASE | re.MULTILINE), build)


RULES: tuple[Rule, ...] = (
    # 1. Configuration errors, before anything ran: Hydra's quote the user's key and value, which may name
    #    an implementation, so they come before every attention rule.
    _rule(Category.hydra_plus_override,
          # Either on the same line, or after the line's end and whitespace: two alternatives that cannot both
          # take the same characters, so a long run of spaces costs one pass (``[^\n]*?\s*`` was quadratic).
          r"Could not override '(?P<key>[^']+)'\.(?:[^\n]*?|[^\n]*\n\s*)To append to your config use \+(?P<append>\S+)",
          _hydra_plus),
    _rule(Category.hydra_plus_override,
          r"An item is already at '(?P<key>[^']+)'\.\s*Either remove \+ prefix: '(?P<existing>[^']+)'", _hydra_plus),
    # 2. The unknown-name message lists every valid name (flash_attention_2 among them): it is the name
    #    that is wrong, whatever else the list mentions.
    _rule(Category.unknown_implementation,
          r"Specified `?attn_implementation=\"?(?P<name>[^\"`\s]*)\"?`? is not supported", _unknown_name),
    # 3. A Hub kernel fails on transformers' flash-attention path (its traceback shows flash frames).
    _rule(Category.kernels_missing, r"`kernels` is either not installed or uses an incompatible version",
          _kernels_missing),
    _rule(Category.kernels_missing, r"requires `kernels` to be installed", _kernels_missing),
    _rule(Category.kernels_missing, r"No module named 'kernels(?:\.[\w.]+)?'", _kernels_missing),
    # 4. flash-attn present but unusable (too old, wrong build): a broken build fails to import too, and is
    #    told from a missing package by the compiled module it names (flash_attn_2_cuda).
    _rule(Category.flash_attn_version, r"FlashAttention(?P<fa>\d) requires at least version `?(?P<min>\d+(?:\.\d+)*)",
          _flash_version),
    _rule(Category.flash_attn_version,
          r"you need flash_attn package version to be greater or equal than (?P<min>\d+(?:\.\d+)*)", _flash_version),
    _rule(Category.flash_attn_version, r"flash_attn\w*(?:\.[\w\-]+)*\.so: undefined symbol", _flash_version),
    _rule(Category.flash_attn_version, r"No module named '(?:flash_attn_\d_cuda|flash_attn_cuda)'", _flash_version),
    _rule(Category.flash_attn_version, r"Flash Attention 2 is not available\. Please refer", _flash_version),
    # 5. transformers checks the package before the device, so on a CPU without flash-attn this one fires.
    _rule(Category.flash_attn_not_installed, r"the package for FlashAttention\d doesn't seem to be installed",
          _flash_not_installed),
    _rule(Category.flash_attn_not_installed, r"the package flash_attn seems to be not installed",
          _flash_not_installed),
    _rule(Category.flash_attn_not_installed, r"No module named 'flash_attn(?:_interface)?(?:\.[\w.]+)?'",
          _flash_not_installed),
    # 6. Device and hardware.
    _rule(Category.not_on_cpu, r"Flash ?Attention ?\d?(?:\.0)? is not available on CPU", _not_on_cpu),
    _rule(Category.not_on_cpu, r"with a model not initialized on GPU and with no GPU available", _not_on_cpu),
    _rule(Category.unsupported_hardware, r"FlashAttention only supports? Ampere GPUs or newer", _unsupported_hardware),
    _rule(Category.unsupported_hardware, r"FlashAttention\d requires compute capability >= (?P<major>\d+)",
          _unsupported_hardware),
    _rule(Category.unsupported_hardware, r"no kernel image is available for execution on the device",
          _unsupported_hardware),
    _rule(Category.head_dim, r"does not support headdim not being a multiple of \d+", _head_dim),
    _rule(Category.head_dim, r"only supports head dimension at most \d+", _head_dim),
    _rule(Category.head_dim, r"backward for head dim > \d+ requires", _head_dim),
    # FlashAttention in fp32: the kernels' refusal at the first forward (FA2, FA3 on Hopper and on Ampere/Ada,
    # FA4's assert) and transformers' warning at load.
    _rule(Category.flash_attn_dtype,
          r"FlashAttention (?P<fa3>on [\w/]+ cards )?only supports? fp16(?:(?P<fa3_fp8>, bf16, and fp8_e4m3)| and bf16) "
          r"data type", _flash_dtype),
    _rule(Category.flash_attn_dtype,
          r"Flash Attention (?P<v>\d) only supports torch\.float16 and torch\.bfloat16 dtypes", _flash_dtype),
    _rule(Category.flash_attn_dtype, r"(?P<fa4>inputs must be float16, bfloat16)", _flash_dtype),
    # 7. The model class.
    _rule(Category.architecture_unsupported,
          r"\b(?P<model>\w+) does not support Flash Attention yet, so it cannot use the `(?P<kernel>[^`]+)` kernel",
          _architecture),
    _rule(Category.architecture_unsupported, r"\b(?P<model>\w+) does not support Flash Attention \d(?:\.0)? yet",
          _architecture),
    _rule(Category.architecture_unsupported,
          r"\b(?P<model>\w+) does not support an attention implementation through "
          r"torch\.nn\.functional\.scaled_dot_product_attention yet", _architecture),
    _rule(Category.architecture_unsupported,
          r"\b(?P<model>\w+) does not support (?:an attention implementation through torch's )?flex_attention",
          _architecture),
    _rule(Category.architecture_unsupported, r"`sdpa` attention does not support `softcap`", _architecture),
    # 8. Kernel features.
    _rule(Category.flex_backward_cpu, r"FlexAttention does not support backward on CPU", _flex_backward),
    _rule(Category.output_attentions_unsupported, r"does not support `?output_attentions=True`?", _output_attentions),
    # 9. The engine. The Turbo conflict message itself says "forces eager", so it comes first.
    _rule(Category.forced_by_engine, r"Do not enable both FSDP-Turbo CP and verl Ulysses SP", _forced_conflict),
    _rule(Category.forced_by_engine,
          r"Ulysses sequence parallelism runs on [\w, ]+, not '(?P<impl>[\w|/@:.\-]+)'", _ulysses_kernel),
    _rule(Category.forced_by_engine,
          r"forc(?:es|ed|ing) (?:the )?(?:attention (?:implementation )?)?(?:to )?`?eager`?|eager (?:attention )?"
          r"(?:is |was )?forced", _forced_eager),
    # 10. Memory, last: an attention error that mentions memory on the way should keep its own cause.
    _rule(Category.out_of_memory, r"(?:CUDA|HIP|NPU|XPU|MPS backend) out of memory", _out_of_memory),
    _rule(Category.out_of_memory, r"OutOfMemoryError", _out_of_memory),
    _rule(Category.out_of_memory, r"DefaultCPUAllocator: can't allocate memory", _out_of_memory),
    _rule(Category.out_of_memory, r"std::bad_alloc", _out_of_memory),
    _rule(Category.out_of_memory, r"^MemoryError\b", _out_of_memory),
)
"""Ordered from the most specific text to the most generic; first match wins. Where two rules could
match one text the earlier is the right answer (the Turbo conflict says "forces eager"; a flash-attn
message may mention memory). The whole table is tried on ``Type: message`` first and only then on the
traceback, so the error a user saw outranks an earlier one chained into its traceback."""


MAX_HEAD_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000
"""What the rules read of an error: the head's start and the traceback's end (where the raising frames are), so
matching costs a bounded time whatever a worker reports."""


def classify(error: ErrorInfo, env: EnvFacts | None = None, *, role: str | None = None) -> Diagnosis:
    """Classify one error. ``role`` (actor, rollout, reference/ref, critic, or None for every role) decides
    which spec keys the remedy patches; ``env`` refines the sentence and the remedy when known. The text is
    truncated (``MAX_HEAD_CHARS``, ``MAX_TRACEBACK_CHARS``) before any rule runs."""
    if role is not None and role not in ROLE_SECTIONS:
        raise ValueError(f"role={role!r} is not a role; valid: {', '.join(ROLE_SECTIONS)} or None for every role")
    head = error.head[:MAX_HEAD_CHARS]
    traceback = error.traceback[-MAX_TRACEBACK_CHARS:]
    texts = [head, f"{head}\n{traceback}"] if traceback else [head]
    for text in texts:
        for rule in RULES:
            found = rule.pattern.search(text)
            if found:
                return rule.build(_Context(error, env, role, found))
    return _other(error, role)


def _other(error: ErrorInfo, role: str | None) -> Diagnosis:
    first_line = error.head.strip().splitlines()[0] if error.head.strip() else ""
    evidence = first_line if len(first_line) <= 400 else first_line[:397] + "..."
    patch = attn_patch(role, Impl.eager.value)
    sentence = ("Not a known attention failure: read the error message, which usually names the valid options; "
                f"if it comes from attention, retrying with {_shown(patch)} gives a plain code path and a readable error.")
    return Diagnosis(
        category=Category.other,
        implementation=_impl_in(error.head),
        step=CATEGORY_STEP[Category.other],
        remedy=Remedy({}, sentence),
        summary=first_line[:200] or "unrecognised error",
        evidence=evidence,
        role=role,
    )


# --------------------------------------------------------------------------------------------
# Back to the fast path


def _cc_ok(env: EnvFacts, want: Any) -> bool:
    return env.compute_capability is not None and tuple(env.compute_capability) >= tuple(want)


CONDITIONS: dict[str, Callable[[EnvFacts, Any], bool]] = {
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


def conditions_met(when: Mapping[str, Any], env: EnvFacts) -> bool:
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


def suggest_return_to_fast_path(diagnosis: Diagnosis, env: EnvFacts) -> str | None:
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
            f"return to {impl} with {_shown(fast_path_patch(diagnosis))}.")
