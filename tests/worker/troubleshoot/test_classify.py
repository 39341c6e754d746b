"""The troubleshooting classifier: every message of ATTENTION_RULES.md (4.x and 5.x wording), the exact
transformers 5.24 strings, real tracebacks captured on this machine, remedies per role, the seed's step
order and the return to the fast path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.attention import messages
from worker.core.environment import Environment
from worker.spec import TURBO_CONFLICT_MESSAGE
from worker.troubleshoot.classify import (
    ACTOR_SP_KEY,
    CATEGORY_STEP,
    CONDITIONS,
    RULES,
    Category,
    Diagnosis,
    ErrorInfo,
    Step,
    attn_patch,
    classify,
    conditions_met,
    dtype_patch,
    eager_remedy,
    fast_path_patch,
    suggest_return_to_fast_path,
)

FIXTURES = Path(__file__).parent / "fixtures" / "tracebacks"

ACTOR_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
CRITIC_KEY = "critic.model.override_config.attn_implementation"

PREFACE2 = "FlashAttention2 has been toggled on, but it cannot be used due to the following error:"
PREFACE3 = "FlashAttention3 has been toggled on, but it cannot be used due to the following error:"
INSTALL_4X = ("Please refer to the documentation of https://huggingface.co/docs/transformers/perf_infer_gpu_one"
              "#flashattention-2 to install Flash Attention 2.")
HUB_PAGE = (" Please request to add support where the model is hosted, on its model hub page: "
            "https://huggingface.co/org/model/discussions/new or in the Transformers GitHub repo: "
            "https://github.com/huggingface/transformers/issues/new")
SDPA_TAIL = (" Please request the support for this architecture: https://github.com/huggingface/transformers/issues/"
             "28005. If you believe this error is a bug, please open an issue in Transformers GitHub repository and "
             "load your model with the argument `attn_implementation=\"eager\"` meanwhile. Example: `model = "
             "AutoModel.from_pretrained(\"openai/whisper-tiny\", attn_implementation=\"eager\")`")
NO_GPU_TAIL = (" This is not supported yet. Please make sure to have access to a GPU and either initialise the model "
               "on a GPU by passing a device_map or initialising the model on CPU and then moving it to GPU.")
UNKNOWN_5X = ('Specified `attn_implementation="flsh"` is not supported. The only possible arguments are '
              '`attn_implementation="eager"`, `"paged|eager"`, `"attn_implementation=flash_attention_2"`, '
              '`"attn_implementation=flash_attention_3"`, `"attn_implementation=flash_attention_4"`, '
              '`"attn_implementation=sdpa"`, `"attn_implementation=flex_attention"`.')
UNKNOWN_4X = ('Specified `attn_implementation="flash_attn"` is not supported. The only possible arguments are '
              '`attn_implementation="eager"` (manual attention implementation), '
              '`"attn_implementation=flash_attention_2"` (implementation using flash attention 2), '
              '`"attn_implementation=sdpa"` (implementation using torch.nn.functional.scaled_dot_product_attention).')
CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 14.75 GiB of which "
            "1.02 GiB is free. Process 1234 has 13.72 GiB memory in use. Of the allocated memory 12.90 GiB is "
            "allocated by PyTorch, and 600.00 MiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.")

C = Category

# (id, exception type, message, category, implementation)
MESSAGES = [
    # flash-attn not installed
    ("fa2-missing-5x", "ImportError", f"{PREFACE2} the package for FlashAttention2 doesn't seem to be installed.",
     C.flash_attn_not_installed, "flash_attention_2"),
    ("fa3-missing-5x", "ImportError", f"{PREFACE3} the package for FlashAttention3 doesn't seem to be installed.",
     C.flash_attn_not_installed, "flash_attention_3"),
    ("fa2-missing-4x", "ImportError", f"{PREFACE2} the package flash_attn seems to be not installed. {INSTALL_4X}",
     C.flash_attn_not_installed, "flash_attention_2"),
    ("flash_attn-import", "ModuleNotFoundError", "No module named 'flash_attn'",
     C.flash_attn_not_installed, "flash_attention_2"),
    ("flash_attn-submodule", "ModuleNotFoundError", "No module named 'flash_attn.bert_padding'",
     C.flash_attn_not_installed, "flash_attention_2"),
    ("fa3-interface-import", "ModuleNotFoundError", "No module named 'flash_attn_interface'",
     C.flash_attn_not_installed, "flash_attention_3"),
    # flash-attn too old, or built for another torch
    ("fa2-old-5x", "ImportError", f"{PREFACE2} FlashAttention2 requires at least version `2.3.3`.",
     C.flash_attn_version, "flash_attention_2"),
    ("fa2-old-4x", "ImportError", f"{PREFACE2} you need flash_attn package version to be greater or equal than "
     f"2.1.0. Detected version 2.0.4. {INSTALL_4X}", C.flash_attn_version, "flash_attention_2"),
    ("fa2-abi", "ImportError", "/usr/local/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-"
     "gnu.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traits",
     C.flash_attn_version, "flash_attention_2"),
    ("fa2-cuda-module", "ModuleNotFoundError", "No module named 'flash_attn_2_cuda'",
     C.flash_attn_version, "flash_attention_2"),
    ("fa2-unusable-4x", "ImportError", f"{PREFACE2} Flash Attention 2 is not available. {INSTALL_4X}",
     C.flash_attn_version, "flash_attention_2"),
    # not on CPU
    ("cpu-5x", "ImportError", f"{PREFACE2} FlashAttention2 is not available on CPU. Please make sure you are on any "
     "of the supported devices: ('cuda', 'mlu', 'musa', 'npu', 'xpu').", C.not_on_cpu, "flash_attention_2"),
    ("cpu-4x", "ValueError", f"{PREFACE2} Flash Attention 2 is not available on CPU. Please make sure torch can "
     "access a CUDA device.", C.not_on_cpu, "flash_attention_2"),
    ("no-gpu-5x", "ValueError", "You are attempting to use Flash Attention 2 with a model not initialized on GPU and "
     f"with no GPU available.{NO_GPU_TAIL}", C.not_on_cpu, "flash_attention_2"),
    ("no-gpu-4x", "ValueError", "You are attempting to use Flash Attention 2.0 with a model not initialized on GPU "
     f"and with no GPU available.{NO_GPU_TAIL}", C.not_on_cpu, "flash_attention_2"),
    # hardware
    ("pre-ampere", "RuntimeError", "FlashAttention only supports Ampere GPUs or newer.",
     C.unsupported_hardware, "flash_attention_2"),
    ("fa3-cc-5x", "ImportError", f"{PREFACE3} FlashAttention3 requires compute capability >= 8, but found (7, 5) "
     "with compute capability 7.x", C.unsupported_hardware, "flash_attention_3"),
    ("fa4-cc-5x", "ImportError", "FlashAttention4 has been toggled on, but it cannot be used due to the following "
     "error: FlashAttention4 requires compute capability >= 9, but found (8, 0) with compute capability 8.x",
     C.unsupported_hardware, "flash_attention_4"),
    ("no-kernel-image", "RuntimeError", "CUDA error: no kernel image is available for execution on the device",
     C.unsupported_hardware, None),
    # head dim
    ("headdim-32", "RuntimeError", "This flash attention build does not support headdim not being a multiple of 32.",
     C.head_dim, "flash_attention_2"),
    ("headdim-256", "RuntimeError", "FlashAttention forward only supports head dimension at most 256",
     C.head_dim, "flash_attention_2"),
    ("headdim-backward", "RuntimeError", "FlashAttention backward for head dim > 192 requires A100/A800 or H100/H800",
     C.head_dim, "flash_attention_2"),
    # architecture
    ("arch-fa2-5x", "ValueError", f"Qwen2AudioEncoder does not support Flash Attention 2 yet.{HUB_PAGE}",
     C.architecture_unsupported, "flash_attention_2"),
    ("arch-fa2-4x", "ValueError", f"MolmoForCausalLM does not support Flash Attention 2.0 yet.{HUB_PAGE}",
     C.architecture_unsupported, "flash_attention_2"),
    ("arch-fa3-5x", "ValueError", f"BertModel does not support Flash Attention 3 yet.{HUB_PAGE}",
     C.architecture_unsupported, "flash_attention_3"),
    ("arch-kernel-5x", "ValueError", "BertModel does not support Flash Attention yet, so it cannot use the "
     f"`kernels-community/flash-attn2` kernel.{HUB_PAGE}", C.architecture_unsupported, "kernels-community/flash-attn2"),
    ("arch-sdpa", "ValueError", "GPT2Model does not support an attention implementation through "
     f"torch.nn.functional.scaled_dot_product_attention yet.{SDPA_TAIL}", C.architecture_unsupported, "sdpa"),
    ("arch-flex", "ValueError", "BertModel does not support an attention implementation through torch's "
     "flex_attention. Please request the support for this architecture: https://github.com/huggingface/transformers/"
     "issues/34809.", C.architecture_unsupported, "flex_attention"),
    ("sdpa-softcap", "ValueError", "`sdpa` attention does not support `softcap`. Try using `eager`, "
     "`flex_attention`, or the few FA kernels supporting it", C.architecture_unsupported, "sdpa"),
    # unknown name
    ("unknown-5x", "ValueError", UNKNOWN_5X, C.unknown_implementation, "flsh"),
    ("unknown-4x", "ValueError", UNKNOWN_4X, C.unknown_implementation, "flash_attn"),
    # Hub kernels
    ("kernels-5x", "ImportError", "`kernels` is either not installed or uses an incompatible version. Please install "
     "a compatible version (0.18.2 <= version < 0.19.0), e.g. `pip install kernels==0.18.2`", C.kernels_missing, None),
    ("kernels-layer", "RuntimeError", "LayerRepository requires `kernels` to be installed. Run `pip install kernels`.",
     C.kernels_missing, None),
    ("kernels-import", "ModuleNotFoundError", "No module named 'kernels'", C.kernels_missing, None),
    # flex backward on CPU
    ("flex-cpu", "NotImplementedError", "FlexAttention does not support backward on CPU. Please set the input "
     "requires_grad to False or use another device.", C.flex_backward_cpu, "flex_attention"),
    # output_attentions
    ("outattn-sdpa-5x", "UserWarning", "`sdpa` attention does not support `output_attentions=True`. Please set your "
     "attention to `eager` if you want any of these features.", C.output_attentions_unsupported, "sdpa"),
    ("outattn-fa-5x", "UserWarning", "Flash Attention does not support `output_attentions=True`. Please set your "
     "attention to `eager` if you want any of these features.", C.output_attentions_unsupported, "flash_attention_2"),
    ("outattn-sdpa-4x", "UserWarning", "`sdpa` attention does not support `output_attentions=True` or `head_mask`. "
     "Please set your attention to `eager` if you want any of these features.", C.output_attentions_unsupported,
     "sdpa"),
    ("outattn-sdpa-4.4x", "UserWarning", "LlamaModel is using LlamaSdpaAttention, but `torch.nn.functional."
     "scaled_dot_product_attention` does not support `output_attentions=True`. Falling back to the manual attention "
     "implementation, but specifying the manual implementation will be required from Transformers version v5.0.0 "
     "onwards. This warning can be removed using the argument `attn_implementation=\"eager\"` when loading the model.",
     C.output_attentions_unsupported, "sdpa"),
    # FlashAttention in fp32 (flash-attn's kernels at the first forward; transformers 5.24 only warns at load)
    ("fa2-fp32", "RuntimeError", messages.FLASH_ATTN_DTYPE[2][1], C.flash_attn_dtype, "flash_attention_2"),
    ("fa3-fp32", "RuntimeError", messages.FLASH_ATTN_DTYPE[3][1], C.flash_attn_dtype, "flash_attention_3"),
    ("fa3-fp32-ampere", "RuntimeError", "FlashAttention on Ampere/Ada cards only supports fp16 and bf16 data type",
     C.flash_attn_dtype, "flash_attention_3"),
    ("fa4-fp32", "AssertionError", messages.FLASH_ATTN_DTYPE[4][1], C.flash_attn_dtype, "flash_attention_4"),
    ("fa2-fp32-warning", "", messages.flash_attn_dtype_warning(2, "Qwen2ForCausalLM"), C.flash_attn_dtype,
     "flash_attention_2"),
    ("fa3-fp32-warning", "", messages.flash_attn_dtype_warning(3, "LlamaForCausalLM"), C.flash_attn_dtype,
     "flash_attention_3"),
    # forced by the engine
    ("turbo-conflict", "ValueError", TURBO_CONFLICT_MESSAGE, C.forced_by_engine, "eager"),
    ("turbo-forced", "", "fsdp_turbo with ulysses_sequence_parallel_size=2 forces eager attention "
     "(hf_config._attn_implementation = \"eager\")", C.forced_by_engine, "eager"),
    ("ulysses-kernel", "ValueError", messages.ulysses_kernel("flash_attention_2"), C.forced_by_engine,
     "flash_attention_2"),
    ("forced-to-eager", "", "attention forced to eager by the engine (FSDP-Turbo + Ulysses)", C.forced_by_engine,
     "eager"),
    # Hydra
    ("hydra-append", "hydra.errors.ConfigCompositionException", "Could not override "
     "'actor_rollout_ref.model.override_config.attn_implementation'.\nTo append to your config use "
     "+actor_rollout_ref.model.override_config.attn_implementation=eager", C.hydra_plus_override, "eager"),
    ("hydra-append-one-line", "", "Could not override 'critic.model.override_config.attn_implementation'. To append "
     "to your config use +critic.model.override_config.attn_implementation=sdpa Key 'attn_implementation' is not in "
     "struct full_key: critic.model.override_config.attn_implementation object_type=dict", C.hydra_plus_override,
     "sdpa"),
    ("hydra-no-match", "hydra.errors.ConfigCompositionException", "Could not override 'x'. No match in config.\n"
     "To append to your config use +x=10", C.hydra_plus_override, None),
    ("hydra-already", "hydra.errors.ConfigCompositionException", "An item is already at "
     "'actor_rollout_ref.actor.strategy'.\nEither remove + prefix: 'actor_rollout_ref.actor.strategy=fsdp2'",
     C.hydra_plus_override, None),
    # out of memory
    ("cuda-oom", "torch.OutOfMemoryError", CUDA_OOM, C.out_of_memory, None),
    ("cuda-oom-old", "RuntimeError", "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
     "capacity; 14.61 GiB already allocated)", C.out_of_memory, None),
    ("npu-oom", "RuntimeError", "NPU out of memory. Tried to allocate 1.00 GiB", C.out_of_memory, None),
    ("cpu-oom", "RuntimeError", "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
     "memory: you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)", C.out_of_memory, None),
    ("bad-alloc", "RuntimeError", "std::bad_alloc", C.out_of_memory, None),
    ("memory-error", "MemoryError", "", C.out_of_memory, None),
    # anything else
    ("other-device", "RuntimeError", "Expected all tensors to be on the same device, but found at least two "
     "devices, cuda:0 and cpu!", C.other, None),
    ("other-key", "KeyError", "'model.layers.0.weight'", C.other, None),
]


def node(device: str, compute_capability: tuple[int, int] | None = None, flash_attn_version: str | None = None,
         transformers_version: str = "5.24.0", kernels_installed: bool = False, **more) -> Environment:
    """A node as the classifier reads it: the one ``Environment``."""
    return Environment("node", device, compute_capability, flash_attn_version=flash_attn_version,
                       transformers_version=transformers_version, kernels_installed=kernels_installed, **more)


@pytest.mark.parametrize("exc_type,message,category,impl", [m[1:] for m in MESSAGES], ids=[m[0] for m in MESSAGES])
def test_message_table(exc_type, message, category, impl):
    diagnosis = classify(ErrorInfo(exc_type, message))
    assert diagnosis.category == category
    assert diagnosis.implementation == impl
    assert diagnosis.step == CATEGORY_STEP[category]
    assert diagnosis.summary and "\n" not in diagnosis.summary
    assert diagnosis.remedy.sentence.endswith(".")


# The texts the resolution preview quotes (worker/attention/messages.py) must classify as the preview's rule says.
PREVIEW_MESSAGES = [
    (messages.flash_attn_not_installed(2, 5), C.flash_attn_not_installed, "flash_attention_2"),
    (messages.flash_attn_not_installed(2, 4), C.flash_attn_not_installed, "flash_attention_2"),
    (messages.flash_attn_not_installed(3, 5), C.flash_attn_not_installed, "flash_attention_3"),
    (messages.flash_attn_too_old("2.0.4", 5), C.flash_attn_version, "flash_attention_2"),
    (messages.flash_attn_too_old("2.0.4", 4), C.flash_attn_version, "flash_attention_2"),
    (messages.flash_attn_not_on_cpu(2, 5), C.not_on_cpu, "flash_attention_2"),
    (messages.flash_attn_not_on_cpu(2, 4), C.not_on_cpu, "flash_attention_2"),
    (messages.flash_attn_compute_capability(3, 9, (8, 0)), C.unsupported_hardware, "flash_attention_3"),
    (messages.PRE_AMPERE, C.unsupported_hardware, "flash_attention_2"),
    (messages.architecture_without_flash_attn("Gemma3Model", 2, 5), C.architecture_unsupported, "flash_attention_2"),
    (messages.architecture_without_flash_attn("Gemma3Model", 2, 4), C.architecture_unsupported, "flash_attention_2"),
    (messages.architecture_without_sdpa("GPT2Model"), C.architecture_unsupported, "sdpa"),
    ("GPT2Model does not support flex_attention yet.", C.architecture_unsupported, "flex_attention"),
    (messages.KERNELS_MISSING, C.kernels_missing, None),
    (messages.FLEX_BACKWARD_CPU, C.flex_backward_cpu, "flex_attention"),
    (messages.SDPA_OUTPUT_ATTENTIONS, C.output_attentions_unsupported, "sdpa"),
    (messages.unknown_implementation("flsh"), C.unknown_implementation, "flsh"),
]


@pytest.mark.parametrize("message,category,impl", PREVIEW_MESSAGES, ids=[str(i) for i in range(len(PREVIEW_MESSAGES))])
def test_preview_messages_classify_as_predicted(message, category, impl):
    diagnosis = classify(ErrorInfo("", message))
    assert (diagnosis.category, diagnosis.implementation) == (category, impl)


# (fixture file, exception type, category, implementation, patch for role=critic)
TRACEBACKS = [
    ("flash_attention_2_not_installed", "ImportError", C.flash_attn_not_installed, "flash_attention_2",
     {CRITIC_KEY: "eager"}),  # the guide's second step, as the run page's button and the preflight say
    ("unknown_implementation_name", "ValueError", C.unknown_implementation, "flsh", {CRITIC_KEY: "flash_attention_2"}),
    ("hub_kernel_without_kernels", "ImportError", C.kernels_missing, "kernels-community/flash-attn",
     {CRITIC_KEY: "eager"}),
    ("flex_attention_backward_on_cpu", "NotImplementedError", C.flex_backward_cpu, "flex_attention",
     {CRITIC_KEY: "eager"}),
    ("sdpa_on_model_without_sdpa", "ValueError", C.architecture_unsupported, "sdpa", {CRITIC_KEY: "eager"}),
    ("cpu_out_of_memory", "RuntimeError", C.out_of_memory, None, {}),
    ("eager_attention_out_of_memory", "RuntimeError", C.out_of_memory, "eager", {CRITIC_KEY: "sdpa"}),
    ("hydra_plus_override", "hydra.errors.ConfigCompositionException", C.hydra_plus_override, "eager", {}),
]


@pytest.mark.parametrize("name,exc_type,category,impl,patch", TRACEBACKS, ids=[t[0] for t in TRACEBACKS])
def test_captured_tracebacks(name, exc_type, category, impl, patch):
    error = ErrorInfo.from_traceback_text((FIXTURES / f"{name}.txt").read_text())
    assert error.exc_type == exc_type
    diagnosis = classify(error, role="critic")
    assert (diagnosis.category, diagnosis.implementation, diagnosis.remedy.patch) == (category, impl, patch)
    assert diagnosis.evidence.removesuffix("...") in error.traceback


def test_every_fixture_has_a_table_row():
    assert sorted(p.stem for p in FIXTURES.glob("*.txt")) == sorted(t[0] for t in TRACEBACKS)


def test_hand_written_fixture_is_marked():
    first_lines = {p.stem: p.read_text().splitlines()[0] for p in FIXTURES.glob("*.txt")}
    marked = sorted(name for name, line in first_lines.items() if "hand-written" in line)
    assert marked == ["hydra_plus_override"]


def test_from_exception_matches_a_real_raise():
    try:
        raise ImportError(f"{PREFACE2} the package for FlashAttention2 doesn't seem to be installed.")
    except ImportError as exc:
        error = ErrorInfo.from_exception(exc)
    assert error.exc_type == "ImportError"
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert classify(error).category == C.flash_attn_not_installed


def test_from_exception_qualifies_non_builtin_types_and_keeps_the_cause():
    class ConfigCompositionException(Exception):
        pass

    try:
        try:
            raise ModuleNotFoundError("No module named 'flash_attn'")
        except ModuleNotFoundError as inner:
            raise ConfigCompositionException("loading failed") from inner
    except ConfigCompositionException as exc:
        error = ErrorInfo.from_exception(exc)
    assert error.exc_type.endswith(".ConfigCompositionException") and "." in error.exc_type
    assert "No module named 'flash_attn'" in error.traceback
    # The message says nothing known, so the chained cause in the traceback decides.
    assert classify(error).category == C.flash_attn_not_installed


def test_message_outranks_an_earlier_error_in_the_traceback():
    error = ErrorInfo("torch.OutOfMemoryError", CUDA_OOM,
                      "Traceback (most recent call last):\nModuleNotFoundError: No module named 'kernels'\n")
    assert classify(error).category == C.out_of_memory


def test_unknown_name_lists_valid_names_yet_is_not_a_flash_error():
    diagnosis = classify(ErrorInfo("ValueError", UNKNOWN_5X))
    assert "flash_attention_2" in UNKNOWN_5X and diagnosis.category == C.unknown_implementation


@pytest.mark.parametrize("text,exc_type,message", [
    ("ValueError: something went wrong", "ValueError", "something went wrong"),
    ('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    f()\n    ^^^\nValueError: bad\nvalue\n',
     "ValueError", "bad\nvalue"),
    ("KeyboardInterrupt", "KeyboardInterrupt", ""),
    ("Could not override 'x'.", "", "Could not override 'x'."),
])
def test_traceback_text_parsing(text, exc_type, message):
    error = ErrorInfo.from_traceback_text(text)
    assert (error.exc_type, error.message, error.traceback) == (exc_type, message, text)


# --------------------------------------------------------------------------------------------
# Remedies


FA2_MISSING = ErrorInfo("ImportError", f"{PREFACE2} the package for FlashAttention2 doesn't seem to be installed.")
ARCH_SDPA = ErrorInfo("ValueError", "GPT2Model does not support an attention implementation through "
                                    f"torch.nn.functional.scaled_dot_product_attention yet.{SDPA_TAIL}")


@pytest.mark.parametrize("role,keys", [
    ("actor", [ACTOR_KEY]),
    ("rollout", [ACTOR_KEY]),
    ("reference", [ACTOR_KEY]),
    ("ref", [ACTOR_KEY]),
    ("critic", [CRITIC_KEY]),
    (None, [ACTOR_KEY, CRITIC_KEY]),
])
def test_remedy_patch_per_role(role, keys):
    fa2 = classify(FA2_MISSING, role=role)
    assert fa2.remedy.patch == dict.fromkeys(keys, "eager")
    assert fa2.role == role
    sdpa = classify(ARCH_SDPA, role=role)
    assert sdpa.remedy.patch == dict.fromkeys(keys, "eager")
    for key in keys:
        assert f"{key}=" in fa2.remedy.sentence


def test_unknown_role_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"role='policy' is not a role; valid: actor, rollout, reference, critic, ref"):
        classify(FA2_MISSING, role="policy")


@pytest.mark.parametrize("error,patch", [
    (FA2_MISSING, {ACTOR_KEY: "eager"}),  # the guide's second step: eager
    (ARCH_SDPA, {ACTOR_KEY: "eager"}),
    (ErrorInfo("UserWarning", "`sdpa` attention does not support `output_attentions=True`."), {ACTOR_KEY: "eager"}),
    (ErrorInfo("ValueError", TURBO_CONFLICT_MESSAGE), {ACTOR_SP_KEY: 1}),
    (ErrorInfo("", "attention forced to eager by the engine"), {}),  # a required fallback, nothing to fix
    (ErrorInfo("ModuleNotFoundError", "No module named 'kernels'"), {ACTOR_KEY: "eager"}),
    (ErrorInfo("RuntimeError", "std::bad_alloc"), {}),  # not a spec change
    (ErrorInfo("RuntimeError", "Could not override 'a.b'.\nTo append to your config use +a.b=1"), {}),
    (ErrorInfo("RuntimeError", "weird"), {}),
])
def test_remedy_patches(error, patch):
    assert classify(error, role="actor").remedy.patch == patch


@pytest.mark.parametrize("role,keys", [
    ("actor", ["actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.ref.fsdp_config.dtype",
               "actor_rollout_ref.rollout.dtype"]),
    ("rollout", ["actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.ref.fsdp_config.dtype",
                 "actor_rollout_ref.rollout.dtype"]),
    ("reference", ["actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.ref.fsdp_config.dtype",
                   "actor_rollout_ref.rollout.dtype"]),
    ("critic", ["critic.fsdp.dtype"]),
    (None, ["actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.ref.fsdp_config.dtype",
            "actor_rollout_ref.rollout.dtype", "critic.fsdp.dtype"]),
])
def test_flash_attn_dtype_remedy_sets_the_roles_compute_dtype(role, keys):
    from worker.spec import parse_spec

    diagnosis = classify(ErrorInfo("RuntimeError", messages.FLASH_ATTN_DTYPE[2][1]), A100_FA2, role=role)
    assert diagnosis.category == C.flash_attn_dtype and diagnosis.step == Step.check_compatibility
    assert diagnosis.remedy.patch == dict.fromkeys(keys, "bfloat16")
    assert diagnosis.return_to_fast_path_when is None  # the fix keeps flash_attention_2
    assert "keep flash_attention_2" in diagnosis.remedy.sentence
    fixed = parse_spec({"actor_rollout_ref.actor.fsdp_config.dtype": "fp32", "critic.fsdp.dtype": "fp32",
                        "actor_rollout_ref.ref.fsdp_config.dtype": "fp32", "actor_rollout_ref.rollout.dtype": "fp32",
                        **diagnosis.remedy.patch})
    patched_roles = {"actor", "reference", "rollout"} if role != "critic" else set()
    patched_roles |= {"critic"} if role in ("critic", None) else set()
    for name in ("actor", "reference", "rollout", "critic"):
        assert fixed.precision(name)[0] == ("bfloat16" if name in patched_roles else "float32")


# Whatever the node and whatever the error taught, a role that cannot run its attention gets the guide's second
# step: eager_remedy's patch, the one the run page's button and the preview's preflight apply.
H100_FA2 = node("cuda", (9, 0), flash_attn_version="2.8.3")
A100_FA2 = node("cuda", (8, 0), flash_attn_version="2.8.3")


@pytest.mark.parametrize("error,env", [
    (ErrorInfo("ImportError", f"{PREFACE3} the package for FlashAttention3 doesn't seem to be installed."), H100_FA2),
    # an H100 with flash-attn 2 could run fa2, yet the guide's step is eager; the entry says return to the fast path
    (ErrorInfo("ImportError", f"{PREFACE3} the package for FlashAttention3 doesn't seem to be installed."),
     node("cuda", (9, 0))),
    (ErrorInfo("ImportError", "FlashAttention3 has been toggled on, but it cannot be used due to the following error: "
                              "FlashAttention3 requires compute capability >= 9, but found (8, 0) with compute "
                              "capability 8.x"), node("cuda", (8, 0), flash_attn_version="2.8.3")),
    (ErrorInfo("ValueError", f"BertModel does not support Flash Attention 3 yet.{HUB_PAGE}"), H100_FA2),
    (ErrorInfo("ValueError", messages.ulysses_kernel("flash_attention_3")), H100_FA2),
    (ErrorInfo("ModuleNotFoundError", "No module named 'kernels'"), node("cpu")),
    (ErrorInfo("ModuleNotFoundError", "No module named 'kernels'"), A100_FA2),
    (ErrorInfo("UserWarning", "Flash Attention does not support `output_attentions=True`."), A100_FA2),
    (ErrorInfo("RuntimeError", "This flash attention build does not support headdim not being a multiple of 32."),
     A100_FA2),
])
def test_a_role_that_cannot_run_its_attention_gets_the_one_eager_remedy(error, env):
    for role in ("actor", "reference", "critic"):
        diagnosis = classify(error, env, role=role)
        assert diagnosis.step in (Step.fall_back_to_eager, Step.check_hardware, Step.check_compatibility)
        assert diagnosis.remedy.patch == eager_remedy([role]).patch


def test_ulysses_remedy_says_the_limit_is_attnboards():
    sentence = classify(ErrorInfo("ValueError", messages.ulysses_kernel("flash_attention_2")), role="actor").remedy.sentence
    assert "verl's own Ulysses runs flash_attention_2" in sentence


def test_hydra_sentence_gives_the_corrected_argument():
    diagnosis = classify(ErrorInfo.from_traceback_text((FIXTURES / "hydra_plus_override.txt").read_text()))
    assert "+actor_rollout_ref.model.override_config.attn_implementation=eager" in diagnosis.remedy.sentence
    assert diagnosis.role == "actor"  # read from the key when no role is given
    already = classify(ErrorInfo("", "An item is already at 'trainer.nnodes'.\nEither remove + prefix: "
                                     "'trainer.nnodes=2'"))
    assert "drop the + and write trainer.nnodes=2" in already.remedy.sentence


@pytest.mark.parametrize("env,target", [
    (None, "flash_attention_2"),  # the seed starts from the default
    (node("cpu"), "sdpa"),  # flash_attention_2 cannot load here: the best the node can run
    (node("cuda", (7, 5)), "sdpa"),
    (node("cuda", (8, 0), flash_attn_version="2.8.3"), "flash_attention_2"),
])
def test_unknown_name_suggests_what_was_meant_or_what_can_run(env, target):
    diagnosis = classify(ErrorInfo("ValueError", UNKNOWN_5X), env, role="critic")
    assert diagnosis.remedy.patch == {CRITIC_KEY: target}
    assert '"flsh" (probably "flash_attention_2")' in diagnosis.remedy.sentence


def test_unknown_name_keeps_to_the_names_the_model_lists():
    message = ('Specified `attn_implementation="sdpaa"` is not supported. The only possible arguments are '
               '`attn_implementation="eager"`, `"paged|eager"`, `"attn_implementation=flash_attention_2"`.')
    diagnosis = classify(ErrorInfo("ValueError", message), node("cpu"), role="actor")
    assert diagnosis.remedy.patch == {ACTOR_KEY: "eager"}  # sdpa was meant but this model does not offer it


@pytest.mark.parametrize("env,phrase", [
    (None, "pip install flash-attn"),
    (node("cpu"), "this machine cannot run it either"),
    (node("cuda", (7, 5)), "compute capability 7.5"),
])
def test_not_installed_sentence_uses_the_environment(env, phrase):
    assert phrase in classify(FA2_MISSING, env).remedy.sentence


def test_output_attentions_sentence_follows_the_transformers_version():
    error = ErrorInfo("UserWarning", "`sdpa` attention does not support `output_attentions=True`.")
    assert "5.x returns none" in classify(error, node("cpu")).remedy.sentence
    assert "4.x falls back" in classify(error, node("cpu", transformers_version="4.57.1")).remedy.sentence


def test_other_reads_the_error():
    diagnosis = classify(ErrorInfo("RuntimeError", "Expected all tensors to be on the same device"))
    assert (diagnosis.category, diagnosis.step, diagnosis.remedy.patch) == (C.other, Step.read_the_error, {})
    assert diagnosis.return_to_fast_path_when is None
    assert "read the error message" in diagnosis.remedy.sentence
    assert diagnosis.evidence == "RuntimeError: Expected all tensors to be on the same device"


# --------------------------------------------------------------------------------------------
# The seed's order


def test_step_order_is_the_seeds():
    assert [s.value for s in sorted(Step, key=lambda s: s.order)] == [
        "check_compatibility", "fall_back_to_eager", "check_hardware", "read_the_error"]


@pytest.mark.parametrize("category,step", [
    (C.architecture_unsupported, Step.check_compatibility),
    (C.flash_attn_not_installed, Step.fall_back_to_eager),
    (C.unsupported_hardware, Step.check_hardware),
    (C.unknown_implementation, Step.read_the_error),
    (C.other, Step.read_the_error),
])
def test_category_steps(category, step):
    assert CATEGORY_STEP[category] == step


def test_every_category_has_a_step():
    assert set(CATEGORY_STEP) == set(Category)


# --------------------------------------------------------------------------------------------
# Back to the fast path

A100_FA = node("cuda", (8, 0), flash_attn_version="2.8.3")
H100_FA = node("cuda", (9, 0), flash_attn_version="2.8.3")
T4_FA = node("cuda", (7, 5), flash_attn_version="2.8.3")
CPU = node("cpu")

# (id, error, env at classification, later env, expected implementation to return to or None)
FAST_PATH = [
    ("missing-now-present", FA2_MISSING, None, A100_FA, "flash_attention_2"),
    ("missing-still-on-t4", FA2_MISSING, None, T4_FA, None),
    ("missing-still-on-cpu", FA2_MISSING, None, CPU, None),
    ("old-still-old", ErrorInfo("ImportError", f"{PREFACE2} FlashAttention2 requires at least version `2.3.3`."),
     None, node("cuda", (8, 0), flash_attn_version="2.3.2"), None),
    ("old-upgraded", ErrorInfo("ImportError", f"{PREFACE2} FlashAttention2 requires at least version `2.3.3`."),
     None, A100_FA, "flash_attention_2"),
    ("abi-same-build", ErrorInfo("ImportError", "flash_attn_2_cuda.so: undefined symbol: _ZN3c10"),
     node("cuda", (8, 0), flash_attn_version="2.5.0"), node("cuda", (8, 0), flash_attn_version="2.5.0"), None),
    ("abi-reinstalled", ErrorInfo("ImportError", "flash_attn_2_cuda.so: undefined symbol: _ZN3c10"),
     node("cuda", (8, 0), flash_attn_version="2.5.0"), A100_FA, "flash_attention_2"),
    ("cpu-now-gpu", ErrorInfo("ImportError", f"{PREFACE2} FlashAttention2 is not available on CPU."), None, A100_FA,
     "flash_attention_2"),
    ("t4-still-t4", ErrorInfo("RuntimeError", "FlashAttention only supports Ampere GPUs or newer."), None, T4_FA, None),
    ("t4-now-a100", ErrorInfo("RuntimeError", "FlashAttention only supports Ampere GPUs or newer."), None, A100_FA,
     "flash_attention_2"),
    ("fa4-on-a100", ErrorInfo("ImportError", "FlashAttention4 requires compute capability >= 9, but found (8, 0)"),
     None, A100_FA, None),
    ("fa4-on-h100", ErrorInfo("ImportError", "FlashAttention4 requires compute capability >= 9, but found (8, 0)"),
     None, H100_FA, "flash_attention_4"),
    ("kernels-installed", ErrorInfo.from_traceback_text((FIXTURES / "hub_kernel_without_kernels.txt").read_text()),
     None, node("cuda", (8, 0), kernels_installed=True), "kernels-community/flash-attn"),
    ("flex-on-gpu", ErrorInfo("NotImplementedError", "FlexAttention does not support backward on CPU."), None,
     A100_FA, "flex_attention"),
    ("flex-still-cpu", ErrorInfo("NotImplementedError", "FlexAttention does not support backward on CPU."), None,
     CPU, None),
    ("architecture-never", ARCH_SDPA, None, H100_FA, None),
    ("other-never", ErrorInfo("RuntimeError", "weird"), None, H100_FA, None),
]


@pytest.mark.parametrize("error,env,later,impl", [f[1:] for f in FAST_PATH], ids=[f[0] for f in FAST_PATH])
def test_return_to_fast_path(error, env, later, impl):
    diagnosis = classify(error, env, role="critic")
    suggestion = suggest_return_to_fast_path(diagnosis, later)
    if impl is None:
        assert suggestion is None
    else:
        assert suggestion is not None
        assert f"return to {impl} with {CRITIC_KEY}={impl}." in suggestion
        assert fast_path_patch(diagnosis) == {CRITIC_KEY: impl}


def test_fast_path_suggestion_names_the_facts_and_both_roles():
    suggestion = suggest_return_to_fast_path(classify(FA2_MISSING), A100_FA)
    assert suggestion == (
        "The cause of the earlier flash_attn_not_installed failure is gone (device cuda, compute capability 8.0, "
        f"flash-attn 2.8.3): return to flash_attention_2 with {ACTOR_KEY}=flash_attention_2 and "
        f"{CRITIC_KEY}=flash_attention_2.")


def test_return_conditions_are_what_the_app_can_check():
    diagnosis = classify(FA2_MISSING)
    assert diagnosis.return_to_fast_path_when == {"flash_attn_installed": True, "min_compute_capability": [8, 0]}
    with pytest.raises(ValueError, match=r"return_to_fast_path_when.gpu_count: unknown condition; valid: "):
        conditions_met({"gpu_count": 8}, A100_FA)


def test_diagnosis_round_trips_through_json():
    diagnosis = classify(FA2_MISSING, CPU, role="critic")
    again = Diagnosis.from_dict(diagnosis.as_dict())
    assert again == diagnosis
    assert suggest_return_to_fast_path(again, A100_FA) == suggest_return_to_fast_path(diagnosis, A100_FA)


def test_the_classifier_reads_a_probe_as_an_environment_and_names_bad_fields():
    facts = Environment.from_probe({"name": "probe", "device": "cuda", "compute_capability": [8, 6],
                                    "flash_attn_version": "2.8.3", "torch_version": "2.13.0", "rank": 0})
    assert facts == Environment("probe", "cuda", (8, 6), flash_attn_version="2.8.3")
    with pytest.raises(ValueError, match=r"environment.device: 'tpu' is not valid; valid: cpu, cuda, npu"):
        Environment.from_probe({"device": "tpu"})
    with pytest.raises(ValueError, match=r"environment.compute_capability: \(8,\) must be"):
        Environment.from_probe({"device": "cuda", "compute_capability": (8,)})


def test_an_object_with_the_same_fields_reads_as_an_environment():
    class Probe:
        device = "npu"
        compute_capability = None
        flash_attn_version = None
        transformers_version = "4.57.1"
        kernels_installed = True

    assert Environment.from_probe(Probe()) == Environment("probe", "npu", None, transformers_version="4.57.1",
                                                          kernels_installed=True)


def test_flash_attention_3_installed_is_known_to_the_remedy():
    """The classifier works over the one Environment: a node with FlashAttention 3 installed runs it, so a
    typo meaning fa3 is remedied with flash_attention_3 there, and with the next of the chain where it is not."""
    error = ErrorInfo("ValueError", 'Specified `attn_implementation="fa3"` is not supported. The only possible '
                                    'arguments are `attn_implementation="eager"`, `"sdpa"`, `"flash_attention_2"`, '
                                    '`"flash_attention_3"`')
    with_fa3 = node("cuda", (9, 0), flash_attn_version="2.8.3", flash_attn_3_version="3.0.0b1")
    assert classify(error, with_fa3, role="actor").remedy.patch == {ACTOR_KEY: "flash_attention_3"}
    without = node("cuda", (9, 0), flash_attn_version="2.8.3")
    assert classify(error, without, role="actor").remedy.patch == {ACTOR_KEY: "flash_attention_2"}


# --------------------------------------------------------------------------------------------
# Properties and meta-tests


def test_every_category_has_a_test_case():
    covered = {m[3] for m in MESSAGES} | {t[2] for t in TRACEBACKS}
    assert covered == set(Category)


def test_every_rule_is_exercised_by_the_message_table():
    unused = [rule.pattern.pattern for rule in RULES
              if not any(rule.pattern.search(f"{m[1]}: {m[2]}") for m in MESSAGES)]
    assert unused == []


def test_every_category_but_other_has_a_rule():
    assert {rule.category for rule in RULES} == set(Category) - {C.other}


def test_attn_patch_roles():
    assert attn_patch("reference", "eager") == {ACTOR_KEY: "eager"}
    assert attn_patch(None, "sdpa") == {ACTOR_KEY: "sdpa", CRITIC_KEY: "sdpa"}


ROLES = st.sampled_from([None, "actor", "rollout", "reference", "ref", "critic"])
ALLOWED_KEYS = {ACTOR_KEY, CRITIC_KEY, ACTOR_SP_KEY}


@settings(max_examples=300, deadline=None)
@given(exc_type=st.text(max_size=30), message=st.text(max_size=300), tb=st.text(max_size=300), role=ROLES)
def test_any_text_classifies_without_raising(exc_type, message, tb, role):
    error = ErrorInfo(exc_type, message, tb)
    diagnosis = classify(error, role=role)
    assert diagnosis.step == CATEGORY_STEP[diagnosis.category]
    assert set(diagnosis.remedy.patch) <= ALLOWED_KEYS
    assert diagnosis.evidence.removesuffix("...") in f"{error.head}\n{tb}"
    if diagnosis.return_to_fast_path_when is not None:
        assert set(diagnosis.return_to_fast_path_when) <= set(CONDITIONS)


@settings(max_examples=200, deadline=None)
@given(row=st.sampled_from(MESSAGES), noise=st.text(alphabet="0123456789 \n", max_size=200), role=ROLES)
def test_noise_in_the_traceback_changes_nothing(row, noise, role):
    _, exc_type, message, category, impl = row
    diagnosis = classify(ErrorInfo(exc_type, message, noise), role=role)
    assert (diagnosis.category, diagnosis.implementation) == (category, impl)
    allowed = [set(), set(attn_patch(role, "x"))]
    if category == C.flash_attn_dtype:
        allowed.append(set(dtype_patch(role)))
    if category == C.forced_by_engine:
        allowed.append({ACTOR_SP_KEY})
    assert set(diagnosis.remedy.patch) in allowed


@settings(max_examples=100, deadline=None)
@given(cc=st.tuples(st.integers(0, 12), st.integers(0, 9)), fa=st.one_of(st.none(), st.sampled_from(["2.0.4", "2.3.3", "2.8.3"])),
       kernels=st.booleans(), device=st.sampled_from(["cpu", "cuda", "npu"]))
def test_suggestion_only_when_every_condition_holds(cc, fa, kernels, device):
    env = node(device, cc if device == "cuda" else None, fa, kernels_installed=kernels)
    for row in MESSAGES:
        diagnosis = classify(ErrorInfo(row[1], row[2]))
        suggestion = suggest_return_to_fast_path(diagnosis, env)
        when = diagnosis.return_to_fast_path_when
        assert (suggestion is not None) == (when is not None and conditions_met(when, env))


def test_a_flash_attn_import_error_after_a_failed_hub_fetch_names_the_hub():
    """transformers 5.24 with `kernels` and without flash-attn fetches kernels-community/flash-attn2 first; on an
    offline node the fetch fails and the package's ImportError is re-raised: the traceback shows the Hub."""
    message = messages.flash_attn_not_installed(2, 5)
    offline = ErrorInfo("ImportError", message, (
        "Traceback (most recent call last):\n  File \"transformers/integrations/hub_kernels.py\", line 870, in "
        "load_and_register_attn_kernel\nhuggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested "
        "files in the disk cache and outgoing traffic has been disabled. To enable hf.co look-ups and downloads "
        "online, set 'local_files_only' to False.\n\nDuring handling of the above exception, another exception "
        f"occurred:\n\nImportError: {message}\n"))
    hub = classify(offline, node("cuda", (9, 0), kernels_installed=True), role="actor")
    assert hub.category is Category.flash_attn_not_installed
    assert hub.summary == "flash_attention_2: flash-attn missing and the Hub kernel kernels-community/flash-attn2 unreachable"
    assert "HF_HUB_OFFLINE=1" in hub.remedy.sentence and hub.remedy.patch
    plain = classify(ErrorInfo("ImportError", message), node("cuda", (9, 0)), role="actor")
    assert plain.category is Category.flash_attn_not_installed and "Hub" not in plain.summary


def test_the_4x_message_naming_huggingface_docs_is_not_the_hub_case():
    message = messages.flash_attn_not_installed(2, 4)  # "... refer to the documentation of https://huggingface.co/..."
    diagnosis = classify(ErrorInfo("ImportError", message, f"Traceback ...\nImportError: {message}\n"),
                         node("cuda", (8, 0)), role="actor")
    assert diagnosis.category is Category.flash_attn_not_installed and "Hub" not in diagnosis.summary
