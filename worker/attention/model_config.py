"""What a model folder's config.json says, read without torch or transformers (the spec checks and the
preview need only its numbers, and the CLI should not wait for torch to load to give them).

I/O: reads one small JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.core.vocabulary import ModelInfo

TINY_SHAPE: dict[str, Any] = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "intermediate_size": 128, "max_position_embeddings": 512, "tie_word_embeddings": False}
"""The shape of the built-in presets (``worker.engine.models.PRESETS``)."""
BUILTIN_ARCHITECTURES: dict[str, str] = {"tiny-llama": "LlamaForCausalLM", "tiny-qwen2": "Qwen2ForCausalLM"}
"""Each built-in preset's model class (a test keeps them equal to ``worker.engine.models.PRESETS``)."""


class ModelPathError(ValueError):
    """A model path that cannot be used: outside the allowed roots, missing, or not a model folder.
    ``field`` and ``value`` say which spec key and which path (for an API error)."""

    def __init__(self, message: str, *, field: str = "model path", value: str | None = None):
        super().__init__(message)
        self.field = field
        self.value = value


def read_config_json(folder: Path | str) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelPathError(f"{path} does not exist; a Hugging Face model folder holds config.json") from None
    except json.JSONDecodeError as exc:
        raise ModelPathError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelPathError(f"{path} holds a {type(data).__name__}, not a JSON object")
    return data


def _text_config(data: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs keep the language model's numbers under ``text_config``."""
    nested = data.get("text_config")
    return nested if isinstance(nested, dict) and "num_attention_heads" in nested else data


def model_info(folder: Path | str) -> ModelInfo:
    """Architecture, heads, kv heads and hidden size from config.json (no model is built)."""
    data = read_config_json(folder)
    text = _text_config(data)
    architectures = data.get("architectures") or []
    architecture = architectures[0] if architectures else str(data.get("model_type", "unknown"))
    try:
        heads = int(text["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        raise ModelPathError(f"{Path(folder) / 'config.json'} has no integer num_attention_heads") from None
    kv_heads = text.get("num_key_value_heads") or heads
    return ModelInfo(
        architecture=architecture,
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        hidden_size=int(text.get("hidden_size") or 0),
        extra={"model_type": data.get("model_type"), "num_hidden_layers": text.get("num_hidden_layers"),
               "vocab_size": text.get("vocab_size"), "head_dim": text.get("head_dim"),
               "global_head_dim": text.get("global_head_dim")},
    )


def preset_info(name: str) -> ModelInfo:
    """A built-in preset's numbers, without building it."""
    return ModelInfo(architecture=BUILTIN_ARCHITECTURES[name], num_attention_heads=TINY_SHAPE["num_attention_heads"],
                     num_key_value_heads=TINY_SHAPE["num_key_value_heads"], hidden_size=TINY_SHAPE["hidden_size"])
