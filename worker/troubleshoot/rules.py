"""The table: an error's text against ordered rules, first match wins (``classify``). Pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from worker.core.environment import Environment
from worker.core.implementations import Impl
from worker.troubleshoot.builders import (
    _architecture,
    _flash_dtype,
    _flash_not_installed,
    _flash_version,
    _flex_backward,
    _forced_conflict,
    _forced_eager,
    _head_dim,
    _hydra_plus,
    _kernels_missing,
    _not_on_cpu,
    _out_of_memory,
    _output_attentions,
    _ulysses_kernel,
    _unknown_name,
    _unsupported_hardware,
)
from worker.troubleshoot.diagnosis import CATEGORY_STEP, Category, Diagnosis, ErrorInfo, Remedy
from worker.troubleshoot.remedies import ROLE_SECTIONS, MatchContext, attn_patch, impl_in, shown


@dataclass(frozen=True)
class Rule:
    category: Category
    pattern: re.Pattern[str]
    build: Callable[[MatchContext], Diagnosis]


def _rule(category: Category, pattern: str, build: Callable[[MatchContext], Diagnosis]) -> Rule:
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


def classify(error: ErrorInfo, env: Environment | None = None, *, role: str | None = None) -> Diagnosis:
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
                return rule.build(MatchContext(error, env, role, found))
    return _other(error, role)


def _other(error: ErrorInfo, role: str | None) -> Diagnosis:
    first_line = error.head.strip().splitlines()[0] if error.head.strip() else ""
    evidence = first_line if len(first_line) <= 400 else first_line[:397] + "..."
    patch = attn_patch(role, Impl.eager.value)
    sentence = ("Not a known attention failure: read the error message, which usually names the valid options; "
                f"if it comes from attention, retrying with {shown(patch)} gives a plain code path and a readable error.")
    return Diagnosis(
        category=Category.other,
        implementation=impl_in(error.head),
        step=CATEGORY_STEP[Category.other],
        remedy=Remedy({}, sentence),
        summary=first_line[:200] or "unrecognised error",
        evidence=evidence,
        role=role,
    )
