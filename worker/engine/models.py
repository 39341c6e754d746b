"""Models without a hub: built-in tiny presets made in code, and local Hugging Face folders confined to
allowed roots.

One loading path serves both. A preset (``builtin:tiny-llama``, ``builtin:tiny-qwen2``) is first
materialised as an ordinary HF folder (config.json, model.safetensors, tokenizer files) by
``ensure_builtin_folder``; from there on, ``build_config`` -> ``load_causal_lm`` / ``load_value_model``
treat it like any local model.

The config rule (ATTENTION_RULES.md): transformers mutates the config object handed to a load even when
the load fails (after a flash_attention_2 ImportError, ``config._attn_implementation`` stays
"flash_attention_2"). ``build_config`` therefore reads a FRESH config from disk on every call; callers
build a new config for every attempt (every role, every fallback step) and never reuse one that a load
has touched.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from worker.attention.model_config import BUILTIN_PREFIX, TINY_SHAPE, ModelPathError, model_folder, model_info

DEFAULT_SEED = 0

# --------------------------------------------------------------------------------------------
# The character-level tokenizer

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = "0123456789" + "abcdefghijklmnopqrstuvwxyz" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + " \n"
"""One token per character: digits, lowercase letters, ASCII punctuation, space and newline. Anything
else (uppercase included) encodes as <unk>."""


def char_vocab() -> dict[str, int]:
    """Token -> id: the special tokens first (<pad>=0, <bos>=1, <eos>=2, <unk>=3), then CHARACTERS."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    return vocab


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer built with the ``tokenizers`` library, wrapped for transformers.

    Encoding adds <bos> in front (like Llama's tokenizer); decoding fuses characters without spaces.
    It has no chat template: ``worker.ppo.data`` renders chat messages with its own simple template.
    ``save_pretrained`` writes a normal HF tokenizer folder (tokenizer.json, tokenizer_config.json).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = char_vocab()
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                   model_max_length=512)


# --------------------------------------------------------------------------------------------
# Built-in presets


@dataclass(frozen=True)
class Preset:
    """A tiny model made in code: its HF config class and the keyword arguments for it."""

    config_class: type[PretrainedConfig]
    config_kwargs: dict[str, Any]

    def make_config(self) -> PretrainedConfig:
        vocab = char_vocab()
        return self.config_class(
            vocab_size=len(vocab), bos_token_id=vocab[BOS], eos_token_id=vocab[EOS], pad_token_id=vocab[PAD],
            **self.config_kwargs,
        )


_TINY = dict(TINY_SHAPE)

PRESETS: dict[str, Preset] = {
    "tiny-llama": Preset(LlamaConfig, dict(_TINY)),
    "tiny-qwen2": Preset(Qwen2Config, dict(_TINY, use_sliding_window=False)),
}


def is_builtin(path: str) -> bool:
    return path.startswith(BUILTIN_PREFIX)


def preset_name(path: str, *, field: str = "model path") -> str:
    """``builtin:tiny-llama`` -> ``tiny-llama``; an unknown preset lists the valid ones."""
    name = path[len(BUILTIN_PREFIX):] if is_builtin(path) else path
    if name not in PRESETS:
        raise ModelPathError(f"{field} {path!r}: unknown built-in preset; valid: "
                             f"{', '.join(BUILTIN_PREFIX + n for n in PRESETS)}", field=field, value=path)
    return name


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block under ``torch.manual_seed(seed)`` without disturbing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_builtin_model(name: str, seed: int = DEFAULT_SEED) -> PreTrainedModel:
    """A preset's causal LM with seeded random weights: the same seed gives the same weights in any process."""
    config = PRESETS[preset_name(name)].make_config()
    with seeded(seed):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _preset_digest(name: str, seed: int) -> str:
    """Identifies what a materialised folder holds, so a changed preset never reuses a stale folder."""
    import transformers

    ident = {
        "config": PRESETS[name].make_config().to_dict(),
        "vocab": char_vocab(),
        "seed": seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]


def ensure_builtin_folder(name: str, cache_dir: Path | str, *, seed: int = DEFAULT_SEED) -> Path:
    """Materialise a preset as a real HF folder under ``cache_dir`` and return it.

    Idempotent and safe when several ranks call it at once: the folder is written under a temporary
    name and renamed into place; a rank that loses the race uses the winner's (identical) folder.
    """
    preset = preset_name(name)
    target = Path(cache_dir) / f"{preset}-seed{seed}-{_preset_digest(preset, seed)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build_builtin_model(preset, seed).save_pretrained(staging)
        build_char_tokenizer().save_pretrained(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def default_cache_dir() -> Path:
    """Where presets are materialised when the caller names no folder: one per machine user."""
    return Path(tempfile.gettempdir()) / f"attnboard-models-{os.getuid()}"


# --------------------------------------------------------------------------------------------
# Local folders confined to allowed roots


def model_roots_from_env(value: str | None) -> list[Path]:
    """Parse ``ATTNBOARD_MODEL_ROOTS`` (folders separated by ``os.pathsep``); the caller reads the variable."""
    if not value:
        return []
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part.strip()]


def resolve_model_path(path: str, roots: list[Path], *, cache_dir: Path | str | None = None,
                       seed: int = DEFAULT_SEED, field: str = "model path") -> Path:
    """The real folder of a model, refused unless it lies inside one of ``roots``.

    - ``builtin:<preset>`` is always allowed and is materialised under ``cache_dir``.
    - A relative path is looked up under each root in turn.
    - ``..`` components are refused outright; symbolic links are resolved first, so a link inside a
      root that points outside is refused.
    - The folder must exist, be a folder, and hold config.json.

    Errors start with ``field`` (e.g. ``critic.model.path``) and the path, and name the allowed roots.
    """
    if is_builtin(path):
        preset_name(path, field=field)
        return ensure_builtin_folder(path, cache_dir if cache_dir is not None else default_cache_dir(), seed=seed)
    return model_folder(path, roots, field=field)


# --------------------------------------------------------------------------------------------
# Config and loading


def build_config(folder: Path | str, override_config: dict[str, Any], attn_implementation: str) -> PretrainedConfig:
    """A fresh config from ``folder/config.json`` with the attention and the overrides applied.

    ``attn_implementation`` goes to ``AutoConfig.from_pretrained`` (as verl does); every other key of
    ``override_config`` is written with setattr, recursing into dicts that are already dicts on the
    config (``{"rope_scaling": {"type": "linear"}}`` updates one entry), verl's ``update_model_config``.
    Never reuse the result after a load failed with it: transformers leaves the config mutated.
    """
    config = AutoConfig.from_pretrained(str(folder), attn_implementation=attn_implementation)
    overrides = {k: v for k, v in override_config.items() if k != "attn_implementation"}
    update_model_config(config, overrides)
    return config


def update_model_config(config: Any, overrides: dict[str, Any]) -> None:
    """verl's ``update_model_config``: setattr per key, recursing into dicts. A dict value for a
    sub-config (``text_config``) updates it in place, as verl does; for an attribute that is a plain
    dict (``rope_parameters``) it is merged into a copy key by key (verl would fail on a dict there);
    otherwise it is set whole."""
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(value, dict) and isinstance(current, dict):
            merged = copy.deepcopy(current)
            _merge_into_dict(merged, value)
            setattr(config, key, merged)
        elif isinstance(value, dict) and isinstance(current, PretrainedConfig):
            update_model_config(current, value)
        else:
            setattr(config, key, copy.deepcopy(value))


def _merge_into_dict(target: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into_dict(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def load_causal_lm(folder: Path | str, config: PretrainedConfig, *, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM of ``folder`` built with ``config`` (and so with its attention implementation).

    Raises what transformers raises when the implementation cannot be used (ImportError for a missing
    flash-attn, ValueError for an unknown name or an architecture without support).
    """
    return AutoModelForCausalLM.from_pretrained(str(folder), config=config, dtype=dtype)


def load_value_model(folder: Path | str, config: PretrainedConfig, *, dtype: torch.dtype = torch.float32,
                     seed: int = DEFAULT_SEED) -> PreTrainedModel:
    """The critic, as verl builds it: ``AutoModelForTokenClassification`` with ``num_labels=1``.

    The backbone is loaded from the causal LM's weights (names match: ``model.*``); the LM head is
    dropped and the one-output ``score`` head is freshly initialised under ``seed``. ``config`` is
    copied, not mutated; the model's own ``config`` carries ``num_labels=1``.
    """
    config = copy.deepcopy(config)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with seeded(seed):
        return AutoModelForTokenClassification.from_pretrained(str(folder), config=config, dtype=dtype)


def load_tokenizer(folder: Path | str) -> Any:
    """The tokenizer saved in a model folder (presets included)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


# --------------------------------------------------------------------------------------------
# What a folder holds, for the resolution preview and the spec checks


def architecture_support(folder: Path | str) -> dict[str, Any]:
    """The transformers model class's attention flags, keyed as ``worker.attention.resolution.ModelSupport`` takes them.

    ``{"model_class": "LlamaForCausalLM", "flash_attn": True, "sdpa": True, "flex_attn": True}``.
    A class this transformers does not know raises ModelPathError naming it.
    """
    import transformers

    info = model_info(folder)
    cls = getattr(transformers, info.architecture, None)
    if not (isinstance(cls, type) and issubclass(cls, PreTrainedModel)):
        raise ModelPathError(f"{Path(folder) / 'config.json'}: architecture {info.architecture!r} is not a model "
                             f"class of transformers {transformers.__version__}")
    return {
        "model_class": cls.__name__,
        "flash_attn": bool(getattr(cls, "_supports_flash_attn", False)),
        "sdpa": bool(getattr(cls, "_supports_sdpa", False)),
        "flex_attn": bool(getattr(cls, "_supports_flex_attn", False)),
    }
