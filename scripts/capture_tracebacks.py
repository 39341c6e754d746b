"""Capture real attention-related tracebacks from this machine into tests/worker/troubleshoot/fixtures/tracebacks/.

Each scenario runs real code in the project's venv (torch CPU build, transformers 5.x, no flash-attn,
no `kernels`, no hydra), catches the exception and writes `traceback.format_exception` text to
`<name>.txt`. The classifier tests read these files back with `ErrorInfo.from_traceback_text`.

One fixture cannot be produced here because hydra is not installed: `hydra_plus_override.txt` is
written from the message text in ATTENTION_RULES.md (Hydra's `ConfigCompositionException` wording) and
is marked as hand-written on its first line.

Run: `.venv/bin/python scripts/capture_tracebacks.py` (about 10 seconds on 2 CPU cores).
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import eager_attention_forward

OUT = Path(__file__).resolve().parent.parent / "tests" / "worker" / "troubleshoot" / "fixtures" / "tracebacks"

HAND_WRITTEN_MARK = "# hand-written from ATTENTION_RULES.md (hydra is not installed here), not captured"


def tiny_config(**overrides) -> LlamaConfig:
    """A two-layer Llama small enough to build in milliseconds on a CPU."""
    values = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    values.update(overrides)
    return LlamaConfig(**values)


def flash_attention_2_not_installed() -> None:
    LlamaForCausalLM(tiny_config(attn_implementation="flash_attention_2"))


def unknown_implementation_name() -> None:
    LlamaForCausalLM(tiny_config(attn_implementation="flsh"))


def hub_kernel_without_kernels() -> None:
    LlamaForCausalLM(tiny_config(attn_implementation="kernels-community/flash-attn"))


def flex_attention_backward_on_cpu() -> None:
    model = LlamaForCausalLM(tiny_config(attn_implementation="flex_attention"))
    input_ids = torch.randint(0, 128, (1, 16))  # (B, T)
    loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()


class NoSdpaLlama(LlamaForCausalLM):
    """A Llama that declares no sdpa support, as some architectures do."""

    _supports_sdpa = False


def sdpa_on_model_without_sdpa() -> None:
    NoSdpaLlama(tiny_config(attn_implementation="sdpa"))


def cpu_out_of_memory() -> None:
    torch.empty(2**62, dtype=torch.uint8)


def eager_attention_out_of_memory() -> None:
    """Eager attention materialises the (T, T) scores: at T = 2**19 that is 1 TiB, refused at once."""
    model = LlamaForCausalLM(tiny_config(attn_implementation="eager"))
    attention = model.model.layers[0].self_attn
    t = 2**19
    query = torch.zeros(1, 4, t, 16)  # (B, nh, T, hs)
    key = value = torch.zeros(1, 2, t, 16)  # (B, n_kv, T, hs)
    eager_attention_forward(attention, query, key, value, attention_mask=None, scaling=0.25)


SCENARIOS: dict[str, Callable[[], None]] = {
    "flash_attention_2_not_installed": flash_attention_2_not_installed,
    "unknown_implementation_name": unknown_implementation_name,
    "hub_kernel_without_kernels": hub_kernel_without_kernels,
    "flex_attention_backward_on_cpu": flex_attention_backward_on_cpu,
    "sdpa_on_model_without_sdpa": sdpa_on_model_without_sdpa,
    "cpu_out_of_memory": cpu_out_of_memory,
    "eager_attention_out_of_memory": eager_attention_out_of_memory,
}

HYDRA_PLUS_OVERRIDE = f"""{HAND_WRITTEN_MARK}
Error executing job with overrides: ['actor_rollout_ref.model.override_config.attn_implementation=eager']
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/hydra/_internal/config_loader_impl.py", line 404, in _apply_overrides_to_config
    OmegaConf.update(cfg, key, value, merge=True)
omegaconf.errors.ConfigAttributeError: Key 'attn_implementation' is not in struct
    full_key: actor_rollout_ref.model.override_config.attn_implementation
    object_type=dict

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/hydra/_internal/config_loader_impl.py", line 406, in _apply_overrides_to_config
    raise ConfigCompositionException(
hydra.errors.ConfigCompositionException: Could not override 'actor_rollout_ref.model.override_config.attn_implementation'.
To append to your config use +actor_rollout_ref.model.override_config.attn_implementation=eager
"""


def capture(run: Callable[[], None]) -> str:
    try:
        run()
    except BaseException as exc:  # every scenario is expected to raise; keep what it raised
        return "".join(traceback.format_exception(exc))
    raise RuntimeError(f"scenario {run.__name__} did not raise: nothing to capture")


def main() -> int:
    logging.disable(logging.WARNING)  # transformers' warnings are not part of the tracebacks
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, run in SCENARIOS.items():
        text = capture(run)
        (OUT / f"{name}.txt").write_text(text)
        print(f"{name}: {text.strip().splitlines()[-1][:120]}")
    (OUT / "hydra_plus_override.txt").write_text(HYDRA_PLUS_OVERRIDE)
    print("hydra_plus_override: hand-written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
