"""The builders of the rules' diagnoses, one per kind of fix: each reads the match and the node, never
the raw strings again. Pure."""

from __future__ import annotations

import difflib
import re
from typing import Any

from worker.attention.availability import FLASH_MIN_COMPUTE_CAPABILITY, candidates, unavailable
from worker.attention.kernel_sources import HUB_FLASH_KERNELS
from worker.core.implementations import BUILTIN_NAMES, DEFAULT_IMPL, Impl, is_hub_kernel
from worker.troubleshoot.diagnosis import Category, Diagnosis
from worker.troubleshoot.remedies import (
    ACTOR_SP_KEY,
    MatchContext,
    attn_patch,
    diagnosis_for,
    dtype_patch,
    eager_patch,
    flash_impl,
    implementation_of,
    min_cc,
    node_context,
    shown,
    who,
)


def _hydra_plus(ctx: MatchContext) -> Diagnosis:
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
    return diagnosis_for(ctx, Category.hydra_plus_override, impl=impl, patch={}, sentence=sentence,
                      summary=summary, role=role)


_LISTED_NAME = re.compile(r"[\"=](?P<name>(?:paged\|)?(?:eager|sdpa|flex_attention|flash_attention_\d))[\"`]")

# Short names people type, mapped to what they mean; used to read a typo like "flsh" as flash_attention_2.
_ALIASES: dict[str, str] = {name: name for name in BUILTIN_NAMES} | {
    "flash": "flash_attention_2", "fa2": "flash_attention_2", "flash_attn": "flash_attention_2",
    "flash_attn_2": "flash_attention_2", "flash_attention": "flash_attention_2", "fa3": "flash_attention_3",
    "fa4": "flash_attention_4", "flex": "flex_attention", "math": "eager", "manual": "eager",
}


def _unknown_name(ctx: MatchContext) -> Diagnosis:
    typed = ctx.match["name"]
    listed = list(dict.fromkeys(m["name"] for m in _LISTED_NAME.finditer(ctx.error.head))) or list(BUILTIN_NAMES)
    meant = difflib.get_close_matches(typed.lower(), list(_ALIASES), n=1, cutoff=0.6)
    guess = _ALIASES[meant[0]] if meant else None
    node = node_context(ctx)

    def usable(name: str | None) -> bool:  # listed by the model, and the node (when known) can run it
        return name in listed and unavailable(name, node) is None

    target = guess if usable(guess) else next((n for n in candidates(DEFAULT_IMPL, "fallback") if usable(n)),
                                              Impl.eager.value)
    patch = attn_patch(ctx.role, target)
    meaning = f' (probably "{guess}")' if guess else ""
    sentence = (f'"{typed}"{meaning} is not an attention implementation this model accepts '
                f"({', '.join(listed)}): set {shown(patch)}.")
    return diagnosis_for(ctx, Category.unknown_implementation, impl=typed, patch=patch, sentence=sentence,
                      summary=f'unknown attention implementation "{typed}"')


_HUB_NAME = re.compile(r"[\"'`](?P<name>[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*(?:@[\w.\-/]+)?(?::\w+)?)[\"'`]")


def _kernels_missing(ctx: MatchContext) -> Diagnosis:
    names = [m["name"] for m in _HUB_NAME.finditer(f"{ctx.error.head}\n{ctx.error.traceback}")]
    kernel = next((name for name in names if is_hub_kernel(name) and "site-packages" not in name), None)
    patch = eager_patch(ctx.role)
    asked = kernel or "a Hub kernel"
    sentence = (f"{kernel or 'A Hub kernel'} needs the `kernels` package: set {shown(patch)} so {who(ctx.role)} trains now, "
                f"then pip install kernels (the version the message names) and return to {kernel or 'the kernel'}.")
    return diagnosis_for(ctx, Category.kernels_missing, impl=kernel, patch=patch, sentence=sentence,
                      summary=f"{asked} requested but `kernels` is not installed",
                      return_when={"kernels_installed": True})


def _flash_version(ctx: MatchContext) -> Diagnosis:
    impl = flash_impl(ctx)
    patch = eager_patch(ctx.role)
    minimum = ctx.match.groupdict().get("min")
    if minimum:
        found = f" (found {ctx.env.flash_attn_version})" if ctx.env and ctx.env.flash_attn_version else ""
        sentence = (f"flash-attn is older than {impl} needs{found}: set {shown(patch)} so {who(ctx.role)} "
                    f"trains now, then upgrade to flash-attn >= {minimum} and return to {impl}.")
        summary = f"flash-attn older than {minimum}"
        when: dict[str, Any] | None = {"min_flash_attn_version": minimum, "min_compute_capability": min_cc(impl)}
    else:
        sentence = (f"flash-attn is installed but was built for another torch or CUDA: set {shown(patch)} so "
                    f"{who(ctx.role)} trains now, then reinstall it against this torch "
                    f"(pip install --force-reinstall --no-build-isolation flash-attn) and return to {impl}.")
        summary = "flash-attn binary does not match this torch/CUDA (ABI mismatch)"
        before = ctx.env.flash_attn_version if ctx.env else None
        when = {"flash_attn_version_not": before, "min_compute_capability": min_cc(impl)} if before else None
    return diagnosis_for(ctx, Category.flash_attn_version, impl=impl, patch=patch, sentence=sentence,
                      summary=summary, return_when=when)


HUB_FETCH_EVIDENCE = re.compile(r"from the `kernels` library instead|kernels-community/|We couldn't connect to '"
                                r"https://huggingface\.co'|LocalEntryNotFoundError|HF_HUB_OFFLINE|hub_kernels\.py")
"""In an ImportError's traceback: transformers tried a Hub kernel (``worker.attention.kernel_sources``) first."""


def _flash_not_installed(ctx: MatchContext) -> Diagnosis:
    impl = flash_impl(ctx)
    cc = min_cc(impl)
    patch = eager_patch(ctx.role)
    env = ctx.env
    if HUB_FETCH_EVIDENCE.search(ctx.error.traceback) and impl in HUB_FLASH_KERNELS:
        # transformers 5.24 with `kernels` and without flash-attn fetches a Hub kernel first; when the node cannot
        # reach the Hub it re-raises the package check, so this message hides the real cause.
        repo = HUB_FLASH_KERNELS[impl]
        sentence = (f"flash-attn is not installed, and transformers' fallback, {repo} from the Hugging Face Hub via "
                    f"`kernels`, could not be fetched (an offline node): set {shown(patch)} so {who(ctx.role)} "
                    f"trains on eager now, then fetch {repo} into the HF cache the node reads where the Hub is "
                    f"reachable and run with HF_HUB_OFFLINE=1, or pip install flash-attn, and return to {impl}.")
        return diagnosis_for(ctx, Category.flash_attn_not_installed, impl=impl, patch=patch, sentence=sentence,
                             summary=f"{impl}: flash-attn missing and the Hub kernel {repo} unreachable",
                             return_when={"flash_attn_installed": True, "min_compute_capability": cc})
    if env is not None and (env.device == "cpu" or (env.compute_capability or (99, 0)) < tuple(cc)):
        where = "this machine cannot run it either" if env.device == "cpu" else (
            f"this GPU (compute capability {env.compute_capability[0]}.{env.compute_capability[1]}) cannot run it either")
        then = f"move to a GPU with compute capability >= {cc[0]}.{cc[1]} and flash-attn installed"
    else:
        where = ""
        then = f"pip install flash-attn --no-build-isolation on a GPU with compute capability >= {cc[0]}.{cc[1]}"
    sentence = (f"flash-attn is not installed{where and ' and ' + where}: set {shown(patch)} so {who(ctx.role)} "
                f"trains on eager now, then {then} and return to {impl}.")
    return diagnosis_for(ctx, Category.flash_attn_not_installed, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} requested but flash-attn is not installed",
                      return_when={"flash_attn_installed": True, "min_compute_capability": cc})


def _not_on_cpu(ctx: MatchContext) -> Diagnosis:
    impl = flash_impl(ctx)
    cc = min_cc(impl)
    patch = eager_patch(ctx.role)
    sentence = (f"{impl} runs only on a CUDA GPU (compute capability >= {cc[0]}.{cc[1]}) or an Ascend NPU: "
                f"set {shown(patch)} to train on this CPU, and return to {impl} on such a GPU with flash-attn.")
    return diagnosis_for(ctx, Category.not_on_cpu, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} requested on a machine without a GPU",
                      return_when={"flash_attn_installed": True, "min_compute_capability": cc})


def _unsupported_hardware(ctx: MatchContext) -> Diagnosis:
    impl = implementation_of(ctx)
    flash = impl if impl in FLASH_MIN_COMPUTE_CAPABILITY else None
    major = ctx.match.groupdict().get("major")
    cc = [int(major), 0] if major else min_cc(flash or Impl.flash_attention_2.value)
    found = ""
    if ctx.env is not None and ctx.env.compute_capability is not None:
        found = f" (this one is {ctx.env.compute_capability[0]}.{ctx.env.compute_capability[1]})"
    if flash is None:
        sentence = (f"This GPU{found} is not supported by a compiled kernel in use: check the GPU, driver and that "
                    f"torch and flash-attn were built for its architecture, and use eager to find the failing kernel.")
        return diagnosis_for(ctx, Category.unsupported_hardware, impl=impl, patch={}, sentence=sentence,
                          summary="no kernel built for this GPU architecture")
    patch = eager_patch(ctx.role)
    sentence = (f"{flash} needs a GPU with compute capability >= {cc[0]}.{cc[1]}{found}: set {shown(patch)} "
                f"on this GPU, and return to {flash} on a GPU that has it.")
    return diagnosis_for(ctx, Category.unsupported_hardware, impl=flash, patch=patch, sentence=sentence,
                      summary=f"{flash} needs compute capability >= {cc[0]}.{cc[1]}",
                      return_when={"flash_attn_installed": True, "min_compute_capability": cc})


def _head_dim(ctx: MatchContext) -> Diagnosis:
    impl = flash_impl(ctx)
    patch = eager_patch(ctx.role)
    sentence = (f"This model's head dimension is outside what the flash-attn kernel supports: "
                f"set {shown(patch)} for this model; {impl} cannot run it.")
    return diagnosis_for(ctx, Category.head_dim, impl=impl, patch=patch, sentence=sentence,
                      summary=f"head dimension unsupported by {impl}")


def _architecture(ctx: MatchContext) -> Diagnosis:
    impl = ctx.match.groupdict().get("kernel") or implementation_of(ctx)
    model = ctx.match.groupdict().get("model") or "This model"
    patch = eager_patch(ctx.role)
    sentence = (f"{model} has no {impl} implementation: set {shown(patch)} (the guide's second step, eager runs "
                f"every model), and return to {impl} once the model supports it.")
    return diagnosis_for(ctx, Category.architecture_unsupported, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{model} does not support {impl}")


def _flex_backward(ctx: MatchContext) -> Diagnosis:
    impl = Impl.flex_attention.value
    patch = eager_patch(ctx.role)
    sentence = (f"flex_attention cannot train on CPU (no backward there): set {shown(patch)} to train on "
                f"this CPU, and return to flex_attention on a GPU.")
    return diagnosis_for(ctx, Category.flex_backward_cpu, impl=impl, patch=patch, sentence=sentence,
                      summary="flex_attention has no backward pass on CPU", return_when={"device": "cuda"})


def _output_attentions(ctx: MatchContext) -> Diagnosis:
    impl = implementation_of(ctx)
    patch = eager_patch(ctx.role)
    v4 = ctx.env is not None and ctx.env.transformers_major < 5
    behaviour = "transformers 4.x falls back to eager per call" if v4 else "transformers 5.x returns none, silently"
    sentence = (f"Only eager returns attention weights ({behaviour}): set {shown(patch)} for the run that needs "
                f"output_attentions, and keep {impl} otherwise.")
    return diagnosis_for(ctx, Category.output_attentions_unsupported, impl=impl, patch=patch, sentence=sentence,
                      summary=f"output_attentions=True is not supported by {impl}")


def _forced_conflict(ctx: MatchContext) -> Diagnosis:
    patch = {ACTOR_SP_KEY: 1}
    sentence = (f"FSDP-Turbo runs its own Ulysses/CP group (and forces eager): set {shown(patch)}, "
                f"or switch actor_rollout_ref.actor.strategy to fsdp2 to keep verl's Ulysses.")
    return diagnosis_for(ctx, Category.forced_by_engine, impl=Impl.eager.value, patch=patch, sentence=sentence,
                      summary="FSDP-Turbo CP and verl Ulysses SP enabled together")


def _forced_eager(ctx: MatchContext) -> Diagnosis:
    sentence = ("The engine forces eager under FSDP-Turbo with Ulysses sequence parallelism, a required fallback "
                "rather than a configuration conflict: nothing to fix, or use strategy fsdp2 (or "
                f"{ACTOR_SP_KEY}=1) to run a fused kernel.")
    return diagnosis_for(ctx, Category.forced_by_engine, impl=Impl.eager.value, patch={}, sentence=sentence,
                      summary="eager forced by FSDP-Turbo with Ulysses sequence parallelism")


def _ulysses_kernel(ctx: MatchContext) -> Diagnosis:
    impl = ctx.match.group("impl")
    patch = eager_patch(ctx.role)
    sentence = (f"attnboard's Ulysses sequence parallelism wraps eager and sdpa only, not {impl} (verl's own Ulysses "
                f"runs flash_attention_2; attnboard's wrapper does not yet): set {shown(patch)} (the guide's "
                f"second step), or set the sequence-parallel size to 1 to keep {impl}.")
    return diagnosis_for(ctx, Category.forced_by_engine, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} cannot run inside Ulysses sequence parallelism")


def _flash_dtype(ctx: MatchContext) -> Diagnosis:
    found = ctx.match.groupdict()
    if found.get("v"):  # transformers' load-time warning names the version
        impl = f"flash_attention_{found['v']}"
    elif found.get("fa4"):
        impl = Impl.flash_attention_4.value
    elif found.get("fa3") or found.get("fa3_fp8"):  # only hopper/flash_api.cpp says either
        impl = Impl.flash_attention_3.value
    else:
        impl = flash_impl(ctx)
    patch = dtype_patch(ctx.role)
    sentence = (f"{impl} computes in fp16/bf16 only and {who(ctx.role)} computes in float32 (transformers only warns "
                f"at load, the kernel refuses the first forward): set {shown(patch)}, verl's default (the master "
                f"weights stay in model_dtype), and keep {impl}.")
    return diagnosis_for(ctx, Category.flash_attn_dtype, impl=impl, patch=patch, sentence=sentence,
                      summary=f"{impl} asked to compute in float32")


def _out_of_memory(ctx: MatchContext) -> Diagnosis:
    impl = implementation_of(ctx)
    if impl == Impl.eager.value:
        patch = attn_patch(ctx.role, Impl.sdpa.value)
        sentence = (f"Out of memory under eager, which materialises the (T, T) attention scores: set "
                    f"{shown(patch)}, and lower ppo_micro_batch_size_per_gpu if it still does not fit.")
    else:
        patch = {}
        sentence = ("Out of memory: lower ppo_micro_batch_size_per_gpu (or the sequence lengths), keep gradient "
                    "checkpointing on, or enable fsdp_config.param_offload, then retry.")
    return diagnosis_for(ctx, Category.out_of_memory, impl=impl, patch=patch, sentence=sentence,
                      summary="out of memory" + (f" under {impl}" if impl else ""))
