"""Under verl, the rollout engine (vLLM, SGLang, TensorRT-LLM) picks its own attention backend.

``override_config.attn_implementation`` is a Hugging Face config key: it reaches the FSDP models (actor,
reference, critic) and HF rollout, never the inference engine. ``engine_choice(name, env, dtype)`` says
which backend the engine chooses on a target environment, how a verl user would choose another one, and
whether the engine refuses the setup outright. attnboard's own engine does not run these engines: it
generates with the actor's HF model (``worker.engine.rank.RankWorker.generate``), so the resolution keeps
both answers apart (``RoleResolution.under_verl``).

Read from the sources, August 2026 (verl 0.9.1 pins ``vllm==0.24.0`` and ``sglang==0.5.12`` in its extras):

- vLLM (main at 002db495, after the V0 removal; ``VLLM_ATTENTION_BACKEND`` was deprecated by vLLM PR
  #26315 for removal in 0.14 and is no longer read, vLLM issue #50292 on 0.26): the backend is the
  ``--attention-backend`` / ``attention_config.backend`` engine argument, which verl passes through
  ``actor_rollout_ref.rollout.engine_kwargs.vllm``. Without it, ``vllm/platforms/cuda.py``
  (``_get_backend_priorities``, ``get_attn_backend_cls``) takes the first valid of FLASH_ATTN, FLASHINFER,
  TRITON_ATTN, FLEX_ATTENTION (FLASHINFER first on compute capability 10.x). FLASH_ATTN needs compute
  capability >= 8.0 and fp16/bf16 and runs vLLM's own ``vllm_flash_attn`` build (FA3 on 9.x, FA2 on 8.x:
  ``fa_utils.get_flash_attn_version``), whatever flash-attn package the node has; FLASHINFER needs 7.5 to
  12.1 and fp16/bf16 (and head size 64/128/256); TRITON_ATTN takes any GPU and fp32.
  ``vllm/platforms/cpu.py`` always uses CPU_ATTN. bf16 on a GPU below 8.0 is refused
  (``check_if_supports_dtype``).
- SGLang: verl 0.9.1 (``workers/rollout/sglang_rollout/async_sglang_server.py``) sets
  ``attention_backend`` itself unless ``engine_kwargs.sglang.attention_backend`` is given: ``aiter`` on
  ROCm, ``flashinfer`` for sglang >= 0.5.12 ("FA3 CUDA-graph capture is broken on sglang>=0.5.12"), else
  ``fa3``. SGLang's own default (``server_args.py``, used only outside verl) would be fa3 on Hopper with
  CUDA >= 12.3, flashinfer (or triton) elsewhere.
- TensorRT-LLM: verl 0.9.1 starts its PyTorch backend (``trtllm_async_server.py``: ``backend="pytorch"``),
  whose ``attn_backend`` defaults to ``TRTLLM`` (``tensorrt_llm/llmapi/llm_args.py``), TensorRT-LLM's own
  kernels; ``engine_kwargs.trtllm.attn_backend`` chooses VANILLA or FLASHINFER instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from worker.core.environment import Environment

VERL_VERSION = "0.9.1"
HALF_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class EngineChoice:
    """The attention backend verl's rollout engine runs, which ``override_config`` does not reach."""

    engine: str  # vllm | sglang | trtllm
    backend: str | None  # the engine's name for it (FLASH_ATTN, flashinfer, TRTLLM); None: not determined here
    setting: str  # the verl key that would choose another backend
    why: str  # one sentence: why this backend on this environment
    source: str  # what the reading rests on (engine and version)
    error: str | None = None  # the engine's exact refusal, when it would not start at all
    reached_by_override_config: bool = False  # always False: an HF config key never reaches the engine

    @property
    def effective(self) -> str:
        """``engine:backend``, e.g. ``vllm:FLASH_ATTN`` (``vllm:?`` when not determined, ``vllm:error``)."""
        return f"{self.engine}:{'error' if self.error else self.backend or '?'}"


def _setting(engine: str, key: str) -> str:
    return f"actor_rollout_ref.rollout.engine_kwargs.{engine}.{key}"


def _gpu(env: Environment) -> str:
    cc = env.compute_capability
    where = f"compute capability {cc[0]}.{cc[1]}" if cc else "unknown compute capability"
    return f"{env.gpu_name or 'this GPU'} ({where})"


def _vllm(env: Environment, dtype: str) -> EngineChoice:
    setting = _setting("vllm", "attention_backend")
    source = f"vLLM platforms/cuda.py and cpu.py (verl {VERL_VERSION} pins vllm==0.24.0)"

    def choice(backend: str | None, why: str, error: str | None = None) -> EngineChoice:
        return EngineChoice("vllm", backend, setting, why, source, error)

    if env.device == "cpu":
        return choice("CPU_ATTN", "vLLM's CPU platform always runs CPU_ATTN (any other backend asked for is ignored).")
    if env.device != "cuda":
        return choice(None, f"on {env.device} the vLLM platform plugin (e.g. vllm-ascend) picks the backend; "
                            f"attnboard does not model it.")
    cc = env.compute_capability
    if cc is None:
        return choice(None, "the GPU's compute capability is unknown, so vLLM's choice cannot be told.")
    if dtype == "bfloat16" and cc < (8, 0):
        return choice(None, f"vLLM refuses rollout.dtype bfloat16 on {_gpu(env)}; set it to float16.",
                      "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                      f"Your {env.gpu_name or 'this'} GPU has compute capability {cc[0]}.{cc[1]}. You can use float16 "
                      "instead by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.")
    half = dtype in HALF_DTYPES
    flash_attn = half and cc >= (8, 0)
    flashinfer = half and (7, 5) <= cc <= (12, 1)
    if cc[0] == 10 and flashinfer:
        return choice("FLASHINFER", f"on {_gpu(env)} (Blackwell) FLASHINFER comes first in vLLM's priority list.")
    if flash_attn:
        kernel = "FA3" if cc[0] == 9 else "FA4" if cc[0] == 10 else "FA2"
        return choice("FLASH_ATTN", f"FLASH_ATTN is vLLM's first choice on {_gpu(env)} with {dtype}; it runs vLLM's "
                                    f"own vllm_flash_attn build ({kernel} kernels here), whatever flash-attn package "
                                    f"the node has.")
    if flashinfer:
        return choice("FLASHINFER", f"FLASH_ATTN needs compute capability 8.0 on vLLM, so {_gpu(env)} gets FLASHINFER "
                                    f"(for head sizes 64/128/256 with flashinfer installed; TRITON_ATTN otherwise).")
    return choice("TRITON_ATTN", f"neither FLASH_ATTN nor FLASHINFER takes {dtype} on {_gpu(env)}; TRITON_ATTN takes "
                                 f"any GPU and float32.")


def _sglang(env: Environment, dtype: str) -> EngineChoice:
    setting = _setting("sglang", "attention_backend")
    source = f"verl {VERL_VERSION} sglang_rollout/async_sglang_server.py (pins sglang==0.5.12)"
    if env.device != "cuda":
        return EngineChoice("sglang", None, setting,
                            f"verl {VERL_VERSION} asks SGLang for flashinfer (aiter on ROCm); what SGLang does on "
                            f"{env.device} is not modelled here.", source)
    return EngineChoice("sglang", "flashinfer", setting,
                        f"verl {VERL_VERSION} sets attention_backend=flashinfer for sglang >= 0.5.12 (FA3 CUDA-graph "
                        f"capture is broken there), overriding SGLang's own default (fa3 on Hopper).", source)


def _trtllm(env: Environment, dtype: str) -> EngineChoice:
    setting = _setting("trtllm", "attn_backend")
    source = f"verl {VERL_VERSION} trtllm_rollout/trtllm_async_server.py; TensorRT-LLM llmapi/llm_args.py"
    if env.device != "cuda":
        return EngineChoice("trtllm", None, setting, f"TensorRT-LLM runs on NVIDIA GPUs only, not on {env.device}.",
                            source)
    return EngineChoice("trtllm", "TRTLLM", setting,
                        "verl starts TensorRT-LLM's PyTorch backend, whose attn_backend defaults to TRTLLM "
                        "(TensorRT-LLM's own attention kernels).", source)


_ENGINES = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}


def engine_choice(name: str, env: Environment, dtype: str, explicit: str | None = None) -> EngineChoice | None:
    """What rollout engine ``name`` runs for attention under verl on ``env`` with ``rollout.dtype`` (a torch
    dtype name); None for ``hf``, which generates with the actor's HF model under verl too. ``explicit``: the
    backend the spec's ``engine_kwargs.<name>.attention_backend`` (TensorRT-LLM: ``attn_backend``) asks for,
    which verl hands to the engine as given (SGLang: instead of the flashinfer it would set)."""
    choose = _ENGINES.get(name)
    if choose is None:
        return None
    choice = choose(env, dtype)
    if explicit is None or choice.error is not None:
        return choice
    if name == "vllm" and env.device == "cpu":
        return replace(choice, why=f"{choice.setting}={explicit} is ignored: {choice.why}")
    return replace(choice, backend=explicit,
                   why=f"{choice.setting}={explicit} is passed to {name} as given (verl's engine_kwargs), instead of "
                       f"its own choice ({choice.backend or 'not determined here'}); {name} refuses a backend it "
                       f"lacks at start-up.")
