"""verl launch scripts, written in the styles of verl's examples/ and recipe/ folders, imported as bash
reads them.

The oracle is bash itself: each script runs in a sandbox where PATH holds only stubs (python3, python,
torchrun, ray print their arguments and run nothing; every other command is a no-op), so what the
verl command receives is what bash expanded. Every key that command sets must be in the imported spec
or in its pass-through list, with the value bash gave it (where that value is known to the import),
and export -> import must give the same spec back, pass-through keys included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.interop.shell import read_script
from worker.interop.specfile import detect_format
from worker.interop.verl import (
    ENTRY_MESSAGE,
    MEGATRON_MESSAGE,
    VerlImportError,
    export_command,
    export_yaml,
    import_command,
    import_yaml,
    parse_hydra_value,
)
from worker.spec import ALIASES, PASSTHROUGH_NOTE, SPEC_NAMES, RunSpec, classify_key, flatten, parse_spec
from worker.spec.verl_defaults import VERL_VERSION

SCRIPTS = Path(__file__).parent / "fixtures" / "verl_scripts"
ALL = sorted(p.name for p in SCRIPTS.glob("*.sh"))
REFUSED = {
    "refused_megatron_strategy.sh": MEGATRON_MESSAGE.format(what="actor_rollout_ref.actor.strategy=megatron",
                                                            engine="megatron", version=VERL_VERSION),
    "refused_dapo_recipe.sh": ENTRY_MESSAGE.format(entry="recipe.dapo.main_dapo"),
    "refused_one_step_off_policy.sh": ENTRY_MESSAGE.format(entry="recipe.one_step_off_policy.main_ppo"),
}
IMPORTED = [name for name in ALL if name not in REFUSED]
BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is the oracle")

STUB = """#!/bin/sh
printf '%s\\0' "$0" "$@" > "$ORACLE_OUT/call.$$"
"""
PRELUDE = "command_not_found_handle() { return 0; }; ulimit() { :; }; cd() { :; }; source() { :; }; "


def test_the_corpus_is_large_enough() -> None:
    assert len(IMPORTED) >= 40 and set(REFUSED) <= set(ALL)


def bash_call(script: Path, environment: list[str], tmp: Path) -> list[str]:
    """The arguments bash hands to the script's verl command (after ``-m verl.trainer.main_ppo`` or the
    main_ppo.py path), the script run with no arguments and a clean environment."""
    stubs, out = tmp / "bin", tmp / "out"
    stubs.mkdir()
    out.mkdir()
    for name in ("python3", "python", "torchrun", "ray"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    env = {"PATH": str(stubs), "ORACLE_OUT": str(out)}
    env.update({name: f"<{name}>" for name in environment})
    proc = subprocess.run([BASH, "-c", PRELUDE + 'builtin source "$0"', str(script)], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=30)
    calls = [f.read_bytes().decode().split("\0")[:-1] for f in sorted(out.iterdir())]
    verl = [c for c in calls if any(_entry(a) for a in c)]
    assert len(verl) == 1, (proc.stdout, proc.stderr, calls)
    call = verl[0]
    start = next(i for i, a in enumerate(call) if _entry(a)) + 1
    return call[start:]


def _entry(arg: str) -> bool:
    return arg == "verl.trainer.main_ppo" or arg.endswith(("main_ppo.py", "ppo_trainer.py"))


def _expected(args: list[str]) -> dict[str, tuple[str, Any]]:
    """Each key the verl command sets -> (where the import must keep it, the value bash gave)."""
    out: dict[str, tuple[str, Any]] = {}
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = "=" not in arg
            continue
        if arg.startswith("[") or (arg.endswith("]") and "=" not in arg):
            continue  # the seed's [other parameters...] placeholder
        key, _, raw = arg.lstrip("+").partition("=")
        key = SPEC_NAMES.get(ALIASES.get(key, key), ALIASES.get(key, key))
        value = parse_hydra_value(raw)
        if isinstance(value, dict) and value and classify_key(key) not in ("spec", "open"):
            for sub, sub_value in flatten(value, key + ".").items():
                out[sub] = ("modelled" if classify_key(sub) in ("spec", "open") else "passthrough", sub_value)
            continue
        out[key] = ("modelled" if classify_key(key) in ("spec", "open") else "passthrough", value)
    return out


def _known(value: Any) -> bool:
    """A value with no part the import keeps verbatim (the environment, $(...), the script's arguments)."""
    if isinstance(value, str):
        return "$" not in value and "<" not in value
    if isinstance(value, list):
        return all(_known(v) for v in value)
    if isinstance(value, dict):
        return all(_known(v) for v in value.values())
    return True


def _same(imported: Any, bash: Any) -> bool:
    if isinstance(imported, str) and not isinstance(bash, str):
        return imported == (str(bash).lower() if isinstance(bash, bool) else str(bash)) or \
            parse_hydra_value(imported) == bash
    if isinstance(imported, float) or isinstance(bash, float):
        return float(imported) == float(bash)
    return imported == bash


@needs_bash
@pytest.mark.parametrize("name", IMPORTED)
def test_every_key_the_script_sets_survives(name: str, tmp_path: Path) -> None:
    text = (SCRIPTS / name).read_text()
    result = import_command(text)
    script = read_script(text)
    args = bash_call(SCRIPTS / name, script.environment, tmp_path)
    expected = _expected(args)
    modelled = result.overrides
    passthrough = {k.lstrip("+"): v for k, v in result.spec.verl_passthrough.items()}
    tree = result.spec.model_dump()
    assert expected, name
    for key, (where, value) in expected.items():
        if where == "modelled":
            assert key in modelled, (name, key)
            got = modelled[key]
            if classify_key(key) == "spec":  # and the spec holds it, validated
                node: Any = tree
                for part in key.split("."):
                    node = node[part]
                got = node if not isinstance(node, str) or isinstance(got, str) else got
        else:
            assert key in passthrough, (name, key, sorted(passthrough))
            got = passthrough[key]
        if _known(got) and _known(value):
            assert _same(got, value), (name, key, got, value)
    # nothing more than the script set: every pass-through key comes from the command
    assert set(passthrough) <= set(expected), (name, set(passthrough) - set(expected))
    assert PASSTHROUGH_NOTE in " ".join(result.warnings) or not passthrough


@pytest.mark.parametrize("name", IMPORTED)
def test_export_then_import_is_the_identity(name: str) -> None:
    spec = import_command((SCRIPTS / name).read_text()).spec
    for full in (False, True):
        again = import_command(export_command(spec, full=full).text).spec
        assert again == spec, name
        assert again.verl_passthrough == spec.verl_passthrough
    assert import_yaml(export_yaml(spec).text).spec == spec


@pytest.mark.parametrize("name,message", sorted(REFUSED.items()))
def test_unsupported_backends_and_entry_points_get_one_clear_message(name: str, message: str) -> None:
    text = (SCRIPTS / name).read_text()
    with pytest.raises(VerlImportError) as caught:
        import_command(text)
    assert caught.value.message == message
    assert text[caught.value.position:].startswith(caught.value.token)


@pytest.mark.parametrize(
    "name,key,value",
    [
        ("dapo_style_main_ppo.sh", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 20480),
        ("dapo_style_main_ppo.sh", "actor_rollout_ref.rollout.max_num_batched_tokens", 10240),
        ("dapo_style_main_ppo.sh", "+reward_model.reward_kwargs.overlong_buffer_cfg.len", 4096),
        ("dapo_style_main_ppo.sh", "trainer.nnodes", 8),
        ("dapo_style_main_ppo.sh", "actor_rollout_ref.model.path", "${HOME}/verl/models/Qwen2.5-Math-7B"),
        ("gpus_array_count.sh", "trainer.n_gpus_per_node", 4),
        ("gpus_array_count.sh", "data.train_batch_size", 128),
        ("gpus_array_count.sh", "actor_rollout_ref.rollout.tensor_model_parallel_size", 2),
        ("grpo_qwen25_3b_two_datasets.sh", "data.train_files",
         ["$HOME/data/gsm8k/train.parquet", "$HOME/data/math/train.parquet"]),
        ("grpo_sglang_async_if.sh", "data.return_raw_chat", True),
        ("grpo_sglang_async_if.sh", "actor_rollout_ref.rollout.name", "sglang"),
        ("grpo_sync_branch_not_taken.sh", "data.return_raw_chat", ""),
        ("case_strategy.sh", "actor_rollout_ref.actor.fsdp_config.param_offload", False),
        ("case_strategy.sh", "actor_rollout_ref.actor.strategy", "fsdp2"),
        ("function_wrapper.sh", "trainer.experiment_name", "qwen-fn"),
        ("model_basename.sh", "trainer.experiment_name", "Qwen2.5-Math-1.5B_gsm8k_grpo"),
        ("model_basename.sh", "trainer.project_name", "GSM8K"),
        ("assign_default_operator.sh", "trainer.experiment_name", "qwen2.5-0.5b-instruct-ppo"),
        ("test_and_list_defaults.sh", "algorithm.adv_estimator", "grpo"),
        ("test_and_list_defaults.sh", "trainer.save_freq", 50),
        ("positional_args_mode.sh", "trainer.experiment_name", "qwen_${EXP_SUFFIX}"),
        ("tee_log_with_date.sh", "trainer.experiment_name", "ppo_$(date +%Y%m%d)"),
        ("kl_k3_plus_straight_through.sh", "actor_rollout_ref.actor.kl_loss_type", "k3+"),
        ("trtllm_rollout.sh", "actor_rollout_ref.rollout.name", "trtllm"),
        ("estimator_rloo.sh", "algorithm.adv_estimator", "rloo"),
        ("turbo_cp_ulysses.sh", "actor_rollout_ref.actor.fsdp_config.turbo_cp_size", 4),
        ("ppo_ulysses_sp2.sh", "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 2),
        ("common_args_array.sh", "trainer.logger", ["console", "tensorboard"]),
        ("plusplus_force_keys.sh", "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space", 4),
        ("plusplus_force_keys.sh", "+data.my_extra_flag", True),
        ("yaml_logger_and_val_kwargs.sh", "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache",
         True),
        ("hydra_run_dir_and_ray.sh", "hydra.run.dir", "outputs/ppo_run"),
        ("seed_placeholder_sdpa.sh", "critic.model.override_config.attn_implementation", "sdpa"),
    ],
)
def test_values_resolved_as_bash_does(name: str, key: str, value: Any) -> None:
    """Hand-checked values: arithmetic, arrays, defaults, branches, functions, pattern removal."""
    spec = import_command((SCRIPTS / name).read_text()).spec
    flat = {**flatten(spec.model_dump(exclude={"verl_passthrough"})), **spec.verl_passthrough}
    assert flat[key] == value


@pytest.mark.parametrize(
    "name,warning",
    [
        ("env_vars_verbatim.sh", "from the environment, kept verbatim: CUDA_VISIBLE_DEVICES, DATA_ROOT, "
                                 "WANDB_PROJECT, SLURM_JOB_ID"),
        ("dapo_style_main_ppo.sh", "from the environment, not set here, so the script's default is used: NNODES, "
                                   "NGPUS_PER_NODE, RAY_DATA_HOME, MODEL_PATH, CKPTS_DIR, TRAIN_FILE, TEST_FILE"),
        ("tee_log_with_date.sh", "command output, not known here, kept verbatim: $(date +%Y%m%d), $(date +%H%M)"),
        ("ppo_gae_qwen05b_gsm8k.sh", "ignored: $@ (the arguments of the script it came from)"),
        ("positional_args_mode.sh", "ignored: ${@:2} (the arguments of the script it came from)"),
        ("setup_loop_and_mkdir.sh", "ignored shell commands (not the verl command): set, mkdir, pip, "
                                    "huggingface-cli, python3"),
        ("estimator_rloo.sh", "passed through to verl, not run by attnboard: data.val_files, "
                              "data.filter_overlong_prompts, actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu, "
                              "actor_rollout_ref.rollout.tensor_model_parallel_size, "
                              "actor_rollout_ref.rollout.gpu_memory_utilization, trainer.logger, "
                              "trainer.test_freq"),
    ],
)
def test_what_is_not_known_is_listed(name: str, warning: str) -> None:
    assert warning in import_command((SCRIPTS / name).read_text()).warnings


# --------------------------------------------------------------------------------------------
# Arbitrary text: the one error type, never another exception (issue 12)

SHELL_PIECES = [*list("abcxyz_=.+-~ \t\n\\'\"$@#{}[]()<>|&;*?!`,:%^/0123456789"), "$(", "${", "$((",
                "python3 -m verl.trainer.main_ppo ", "[[", "]]", "if ", "fi", "then ", "for ", "do ", "done", "case ", "esac",
                "<<EOF\n", "\\\n", "${X:-", "${#A[@]}", "A=(1 2)", "trainer.nnodes=", "+a.b=", "[x,y]"]
SHELLISH = st.lists(st.sampled_from(SHELL_PIECES), max_size=60).map("".join)


def _only_our_error(text: str) -> None:
    try:
        import_command(text)
    except VerlImportError as exc:
        assert exc.message and isinstance(exc.position, int) and 0 <= exc.position <= len(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_verl_import_error(text: str) -> None:
    _only_our_error(text)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SHELLISH)
def test_shellish_text_raises_only_verl_import_error(text: str) -> None:
    _only_our_error(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([(SCRIPTS / n).read_text() for n in ALL[:12]]), min_size=1, max_size=2),
       st.integers(0, 4000), st.integers(0, 40))
def test_cut_scripts_raise_only_verl_import_error(parts: list[str], cut: int, width: int) -> None:
    text = "\n".join(parts)
    _only_our_error(text[:cut] + text[cut + width:])


def test_spec_with_pass_through_survives_the_api_shape() -> None:
    """The canonical tree (as stored and served) parses back to the same spec, pass-through included."""
    spec = import_command((SCRIPTS / "dapo_style_main_ppo.sh").read_text()).spec
    assert parse_spec(spec.model_dump(mode="json")) == spec
    assert isinstance(spec, RunSpec) and spec.verl_passthrough


def test_bash_oracle_is_a_real_sandbox(tmp_path: Path) -> None:
    """The oracle runs nothing but its stubs: a command outside them leaves no trace."""
    if BASH is None:
        pytest.skip("bash is the oracle")
    script = tmp_path / "s.sh"
    script.write_text("touch made\nmkdir d\npython3 -m verl.trainer.main_ppo a.b=1\n")
    assert bash_call(script, [], tmp_path) == ["a.b=1"]
    assert not (tmp_path / "made").exists() and not (tmp_path / "d").exists()
    assert os.listdir(tmp_path / "bin")


@pytest.mark.parametrize(
    "text,fmt",
    [
        ("set -x\npython3 -m verl.trainer.main_ppo a.b=1", "cli"),
        ("export VLLM_ATTENTION_BACKEND=XFORMERS\n", "cli"),
        ("#!/bin/bash\ntrainer.nnodes=2\n", "cli"),
        ("trainer.nnodes=2 trainer.n_gpus_per_node=4", "cli"),
        ('echo "a: b"\npython3 -m verl.trainer.main_ppo a.b=1', "cli"),
        ("trainer:\n  nnodes: 2\n", "yaml"),
        ("data.train_files: x\n", "yaml"),
        ('{"trainer": {"nnodes": 2}}', "yaml"),
        ("# only a comment\n", "yaml"),
    ],
)
def test_format_is_told_from_the_whole_text(text: str, fmt: str) -> None:
    assert detect_format(text) == fmt


@pytest.mark.parametrize("name", ALL)
def test_every_corpus_script_is_read_as_a_command_line(name: str) -> None:
    assert detect_format((SCRIPTS / name).read_text()) == "cli"
