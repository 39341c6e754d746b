"""Built-in presets, the character tokenizer, config overrides, loading, and path confinement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, PretrainedConfig

from worker.engine import models
from worker.spec import ModelInfo

FA2_NOT_INSTALLED = "FlashAttention2 has been toggled on, but it cannot be used"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def llama_folder(cache_dir) -> Path:
    return models.ensure_builtin_folder("builtin:tiny-llama", cache_dir)


# --------------------------------------------------------------------------------------------
# Tokenizer


def test_char_tokenizer_round_trip_and_specials():
    tok = models.build_char_tokenizer()
    text = "count 0-9: a, b!\nok?"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id == 1
    assert len(ids) == len(text) + 1  # one token per character, plus <bos>
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 2, 3)
    assert len(tok) == len(models.SPECIAL_TOKENS) + len(models.CHARACTERS)
    assert tok("aXb").input_ids == [1, tok.convert_tokens_to_ids("a"), 3, tok.convert_tokens_to_ids("b")]
    assert tok.chat_template is None


def test_char_tokenizer_saves_as_a_normal_hf_folder(tmp_path):
    models.build_char_tokenizer().save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("ab 12").input_ids == models.build_char_tokenizer()("ab 12").input_ids
    assert loaded.decode([*loaded("ab 12").input_ids, loaded.eos_token_id], skip_special_tokens=True) == "ab 12"
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token) == ("<pad>", "<bos>", "<eos>")


# --------------------------------------------------------------------------------------------
# Presets


def test_builtin_weights_are_seeded_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = models.build_builtin_model("builtin:tiny-llama", seed=5)
    assert torch.equal(torch.rand(1), before)  # caller's RNG untouched
    torch.manual_seed(999)
    b = models.build_builtin_model("builtin:tiny-llama", seed=5)
    c = models.build_builtin_model("builtin:tiny-llama", seed=6)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


@pytest.mark.parametrize("preset,arch", [("tiny-llama", "LlamaForCausalLM"), ("tiny-qwen2", "Qwen2ForCausalLM")])
def test_preset_folder_is_a_real_hf_folder(cache_dir, preset, arch):
    folder = models.ensure_builtin_folder(f"builtin:{preset}", cache_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [arch]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["max_position_embeddings"],
            config["tie_word_embeddings"]) == (64, 2, 4, 2, 128, 512, False)
    assert config["vocab_size"] == len(models.char_vocab())
    weights = load_file(folder / "model.safetensors")
    expected = models.build_builtin_model(preset).state_dict()
    assert torch.equal(weights["lm_head.weight"], expected["lm_head.weight"])
    # idempotent: the second call returns the same folder without rewriting it
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert models.ensure_builtin_folder(f"builtin:{preset}", cache_dir) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


def test_another_process_materialises_identical_weights(tmp_path):
    """Ranks materialise presets on their own: the same seed must give the same bytes in any process."""
    script = ("import sys; from worker.engine import models; "
              "print(models.ensure_builtin_folder('builtin:tiny-qwen2', sys.argv[1], seed=7))")
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path / "other")], capture_output=True, text=True,
                           cwd=Path(__file__).parents[3], timeout=300, check=True)
    theirs = Path(other.stdout.strip())
    ours = models.ensure_builtin_folder("builtin:tiny-qwen2", tmp_path / "ours", seed=7)
    assert theirs.name == ours.name
    their_weights, our_weights = load_file(theirs / "model.safetensors"), load_file(ours / "model.safetensors")
    assert their_weights.keys() == our_weights.keys()
    for name, tensor in our_weights.items():
        assert torch.equal(their_weights[name], tensor), name


def test_concurrent_materialisation_ends_with_one_folder(tmp_path):
    with ThreadPoolExecutor(max_workers=3) as pool:
        folders = list(pool.map(lambda _: models.ensure_builtin_folder("builtin:tiny-llama", tmp_path, seed=1), range(3)))
    assert len(set(folders)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [folders[0].name]  # no staging folder left behind
    assert (folders[0] / "model.safetensors").is_file() and (folders[0] / "tokenizer.json").is_file()


def test_unknown_preset_lists_valid_ones(cache_dir):
    with pytest.raises(models.ModelPathError, match="unknown built-in preset; valid: builtin:tiny-llama, builtin:tiny-qwen2"):
        models.ensure_builtin_folder("builtin:gpt5", cache_dir)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_presets_agree_under_eager_and_sdpa(cache_dir, preset):
    folder = models.ensure_builtin_folder(f"builtin:{preset}", cache_dir)
    ids = torch.randint(4, len(models.char_vocab()), (2, 12), generator=torch.Generator().manual_seed(0))
    logits = {}
    for impl in ("eager", "sdpa"):
        model = models.load_causal_lm(folder, models.build_config(folder, {}, impl))
        assert model.config._attn_implementation == impl
        with torch.no_grad():
            logits[impl] = model(input_ids=ids).logits
    assert logits["eager"].shape == (2, 12, len(models.char_vocab()))
    assert (logits["eager"] - logits["sdpa"]).abs().max().item() < 1e-5


# --------------------------------------------------------------------------------------------
# Config and loading


def test_override_config_lands_on_the_config_including_nested_keys(llama_folder):
    overrides = {
        "attn_implementation": "eager",
        "attention_dropout": 0.25,
        "pad_token_id": 2,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0},
        "my_extra_flag": {"a": 1},
    }
    config = models.build_config(llama_folder, overrides, "sdpa")
    assert config._attn_implementation == "sdpa"  # the argument decides, the key is not setattr'd
    assert config.attention_dropout == 0.25 and config.pad_token_id == 2
    assert config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}  # merged
    assert config.my_extra_flag == {"a": 1}
    overrides["my_extra_flag"]["a"] = 2
    assert config.my_extra_flag == {"a": 1}  # copied, not aliased
    model = models.load_causal_lm(llama_folder, config)
    assert model.config.rope_parameters["rope_type"] == "linear"


def test_update_model_config_recurses_into_nested_dicts():
    class Plain:
        # A class attribute on purpose: the update must not mutate it (asserted below).
        rope_scaling: ClassVar[dict] = {"type": "dynamic", "factor": 1.0, "extra": {"x": 1, "y": 2}}

    cfg = Plain()
    cfg.text_config = PretrainedConfig(hidden_size=16, vocab_size=10)
    models.update_model_config(cfg, {"rope_scaling": {"type": "linear", "extra": {"y": 3}}, "hidden_size": 8,
                                     "text_config": {"hidden_size": 32}, "new_dict": {"k": 1}})
    assert cfg.rope_scaling == {"type": "linear", "factor": 1.0, "extra": {"x": 1, "y": 3}}
    assert cfg.hidden_size == 8
    assert (cfg.text_config.hidden_size, cfg.text_config.vocab_size) == (32, 10)  # a sub-config, updated in place
    assert cfg.new_dict == {"k": 1}
    assert Plain.rope_scaling == {"type": "dynamic", "factor": 1.0, "extra": {"x": 1, "y": 2}}  # not mutated


def test_build_config_is_fresh_every_call(llama_folder):
    a = models.build_config(llama_folder, {"attention_dropout": 0.5}, "eager")
    b = models.build_config(llama_folder, {}, "sdpa")
    assert a is not b
    assert b.attention_dropout == 0.0 and b._attn_implementation == "sdpa"


def test_failed_flash_attention_load_then_a_fresh_build_works(llama_folder):
    config = models.build_config(llama_folder, {}, "flash_attention_2")
    with pytest.raises(ImportError, match=FA2_NOT_INSTALLED):
        models.load_causal_lm(llama_folder, config)
    # transformers left the failed request on the config object: reusing it fails again
    assert config._attn_implementation == "flash_attention_2"
    with pytest.raises(ImportError, match=FA2_NOT_INSTALLED):
        models.load_causal_lm(llama_folder, config)
    fresh = models.build_config(llama_folder, {}, "sdpa")
    model = models.load_causal_lm(llama_folder, fresh)
    assert model.config._attn_implementation == "sdpa"


def test_value_model_has_one_label_backbone_from_the_lm_and_a_seeded_head(llama_folder):
    config = models.build_config(llama_folder, {}, "eager")
    critic = models.load_value_model(llama_folder, config, seed=3)
    assert type(critic).__name__ == "LlamaForTokenClassification"
    assert critic.config.num_labels == 1 and config.num_labels != 1  # the caller's config is not mutated
    assert critic.config._attn_implementation == "eager"
    lm = models.load_causal_lm(llama_folder, models.build_config(llama_folder, {}, "eager"))
    assert torch.equal(critic.model.embed_tokens.weight, lm.model.embed_tokens.weight)
    assert torch.equal(critic.model.layers[1].mlp.up_proj.weight, lm.model.layers[1].mlp.up_proj.weight)
    again = models.load_value_model(llama_folder, models.build_config(llama_folder, {}, "eager"), seed=3)
    other = models.load_value_model(llama_folder, models.build_config(llama_folder, {}, "eager"), seed=4)
    assert torch.equal(critic.score.weight, again.score.weight)
    assert not torch.equal(critic.score.weight, other.score.weight)
    with torch.no_grad():
        values = critic(input_ids=torch.tensor([[1, 5, 6, 7]])).logits
    assert values.shape == (1, 4, 1)


def test_model_info_and_architecture_support(llama_folder, cache_dir, tmp_path):
    assert models.model_info(llama_folder) == ModelInfo(
        architecture="LlamaForCausalLM", num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
        extra={"model_type": "llama", "num_hidden_layers": 2, "vocab_size": len(models.char_vocab()),
               "head_dim": 64 // 4, "global_head_dim": None},  # what FlashAttention's head-dim limit is checked on
    )
    assert models.architecture_support(llama_folder) == {
        "model_class": "LlamaForCausalLM", "flash_attn": True, "sdpa": True, "flex_attn": True,
    }
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"], "num_attention_heads": 8}))
    assert models.model_info(tmp_path).num_key_value_heads == 8  # absent kv heads = heads (MHA)
    with pytest.raises(models.ModelPathError, match="'NoSuchForCausalLM' is not a model class of transformers"):
        models.architecture_support(tmp_path)


# --------------------------------------------------------------------------------------------
# Path confinement


@pytest.fixture()
def roots(tmp_path) -> dict[str, Path]:
    root = tmp_path / "models"
    outside = tmp_path / "elsewhere"
    for folder in (root / "good", root / "noconfig", outside / "secret"):
        folder.mkdir(parents=True)
    (root / "good" / "config.json").write_text("{}")
    (outside / "secret" / "config.json").write_text("{}")
    (root / "afile").write_text("x")
    os.symlink(outside / "secret", root / "escape")
    os.symlink(root / "good", root / "inner-link")
    return {"root": root, "outside": outside}


@pytest.mark.parametrize(
    "path,expected",
    [
        ("{root}/good", "{root}/good"),
        ("good", "{root}/good"),  # relative: looked up under the roots
        ("{root}/inner-link", "{root}/good"),  # a link that stays inside is fine
        ("{outside}/secret", "resolves to .* outside the allowed roots"),
        ("{root}/escape", r"resolves to .*secret' \(through a symbolic link\), outside the allowed roots"),
        ("{root}/good/../../elsewhere/secret", "contains '..'"),
        ("{root}/../models/good", "contains '..'"),
        ("{root}/missing", "does not exist"),
        ("{root}/afile", "is not a folder"),
        ("{root}/noconfig", "has no config.json"),
    ],
)
def test_resolve_model_path_confinement(roots, path, expected):
    path = path.format(**roots)
    if expected.startswith("{root}"):
        assert models.resolve_model_path(path, [roots["root"]]) == Path(expected.format(**roots)).resolve()
    else:
        with pytest.raises(models.ModelPathError, match=expected) as info:
            models.resolve_model_path(path, [roots["root"]])
        assert repr(path) in str(info.value)  # names the path
        if "outside" in expected or ".." in expected:
            assert str(roots["root"]) in str(info.value)  # and the allowed roots


def test_no_roots_refuses_every_folder_but_presets_are_always_allowed(roots, cache_dir):
    good = str(roots["root"] / "good")
    with pytest.raises(models.ModelPathError, match=r"\(none: set ATTNBOARD_MODEL_ROOTS\)") as info:
        models.resolve_model_path(good, [], field="critic.model.path")
    assert str(info.value).startswith(f"critic.model.path {good!r} resolves to")
    assert (info.value.field, info.value.value) == ("critic.model.path", good)
    with pytest.raises(models.ModelPathError, match=r"^actor_rollout_ref\.model\.path 'builtin:gpt5': unknown built-in"):
        models.resolve_model_path("builtin:gpt5", [], cache_dir=cache_dir, field="actor_rollout_ref.model.path")
    folder = models.resolve_model_path("builtin:tiny-llama", [], cache_dir=cache_dir)
    assert (folder / "config.json").is_file()


def test_model_roots_from_env(tmp_path):
    value = os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")])
    assert models.model_roots_from_env(value) == [tmp_path / "a", tmp_path / "b"]
    assert models.model_roots_from_env(None) == []


def test_the_torch_free_preset_numbers_are_the_presets():
    """worker.attention.model_config gives the preview a preset's heads without building it: the same numbers."""
    from worker.attention.model_config import BUILTIN_ARCHITECTURES, preset_info

    assert set(BUILTIN_ARCHITECTURES) == set(models.PRESETS)
    for name, preset in models.PRESETS.items():
        config = preset.config_class(**preset.config_kwargs)
        info = preset_info(name)
        assert info.architecture == preset.config_class.__name__.replace("Config", "ForCausalLM")
        assert (info.num_attention_heads, info.num_key_value_heads) == (config.num_attention_heads,
                                                                         config.num_key_value_heads)
