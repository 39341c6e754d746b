"""The oracles of the verl interop tests: bash itself and verl 0.9.1's own Hydra.

``bash_call`` runs a script in a sandbox where PATH holds only stubs (python3, python, torchrun, ray
print their arguments and run nothing; every other command is a no-op), so what the verl command
receives is what bash expanded. ``compose`` hands those arguments to Hydra with verl's own config
folder (from the installed verl wheel, as ``verl.trainer.main_ppo``'s ``@hydra.main`` does) and gives
the composed config, resolved, as dotted keys. ``differences`` compares an import with it key by key.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from worker.interop.verl import ImportResult, parse_hydra_value
from worker.spec import PASSTHROUGH, VERL_NAMES, flatten, spec_to_flat
from worker.spec.engines import ENGINE_STRATEGY
from worker.spec.verl_engine_keys import ENGINE_ABSENT

BASH = shutil.which("bash")

STUB = """#!/bin/sh
printf '%s\\0' "$0" "$@" > "$ORACLE_OUT/call.$$"
"""
PRELUDE = "command_not_found_handle() { return 0; }; ulimit() { :; }; cd() { :; }; source() { :; }; "
ENTRY_NAMES = ("main_ppo.py", "ppo_trainer.py")


def verl_config_dir() -> Path | None:
    """verl 0.9.1's config folder in the installed wheel (``verl/trainer/config``), without importing verl."""
    found = importlib.util.find_spec("verl")
    if found is None or not found.submodule_search_locations:
        return None
    folder = Path(next(iter(found.submodule_search_locations))) / "trainer" / "config"
    return folder if (folder / "ppo_trainer.yaml").is_file() else None


def is_entry(arg: str) -> bool:
    return arg == "verl.trainer.main_ppo" or arg.endswith(ENTRY_NAMES)


def env_value(name: str) -> str:
    """What the sandbox sets a variable of ``environment`` to: text Hydra reads unquoted, marked unknown."""
    return f"_env_{name}_"


def bash_calls(script: Path, environment: list[str], tmp: Path) -> list[list[str]]:
    """Every stubbed command bash ran for ``script`` (run with no arguments, a clean environment, and each
    name in ``environment`` set to ``env_value(name)``), as argv lists."""
    assert BASH is not None
    stubs, out = tmp / "bin", tmp / "out"
    stubs.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    for name in ("python3", "python", "torchrun", "ray", "srun"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    env = {"PATH": str(stubs), "ORACLE_OUT": str(out)}
    env.update({name: env_value(name) for name in environment})
    subprocess.run([BASH, "-c", PRELUDE + 'builtin source "$0"', str(script)], env=env, cwd=tmp,
                   capture_output=True, text=True, timeout=30)
    return [f.read_bytes().decode(errors="replace").split("\0")[:-1] for f in sorted(out.iterdir())]


def bash_call(script: Path, environment: list[str], tmp: Path) -> list[str]:
    """The arguments bash hands to the script's one verl command (after ``-m verl.trainer.main_ppo`` or the
    main_ppo.py path)."""
    calls = bash_calls(script, environment, tmp)
    verl = [c for c in calls if any(is_entry(a) for a in c)]
    assert len(verl) == 1, calls
    call = verl[0]
    start = next(i for i, a in enumerate(call) if is_entry(a)) + 1
    return call[start:]


class HydraRefused(Exception):
    """verl's Hydra does not compose these arguments (verl would stop before training)."""


def _split_options(args: list[str]) -> tuple[str, list[str]]:
    """Hydra's own options (``--config-name`` ...) apart from the overrides, as ``@hydra.main`` reads them."""
    config_name, overrides, skip = "ppo_trainer", [], False
    for k, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq and k + 1 < len(args):
                value, skip = args[k + 1], True
            if name in ("--config-name", "-cn"):
                config_name = value.removesuffix(".yaml")
            elif name not in ("--config-path", "-cp", "--config-dir", "-cd"):
                raise HydraRefused(f"option {arg}")
            continue
        overrides.append(arg)
    return config_name, overrides


@lru_cache(maxsize=512)
def _compose(config_name: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    folder = verl_config_dir()
    assert folder is not None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except Exception as exc:  # Hydra's many error types all mean "verl refuses this argv"
        raise HydraRefused(f"{type(exc).__name__}: {exc}") from None
    if OmegaConf.is_missing(cfg.actor_rollout_ref.rollout, "name"):  # verl's trainer always reads it: ??? stops it
        raise HydraRefused("verl requires actor_rollout_ref.rollout.name (??? in its config)")
    try:
        tree = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # a value verl resolves only at run time (oc.env, its own resolvers): kept unresolved
        tree = OmegaConf.to_container(cfg, resolve=False)
    return _post_init(flatten(tree))


def _post_init(flat: dict[str, Any]) -> dict[str, Any]:
    """verl's own rewrite of the composed config when it builds its dataclasses (verl/workers/config/actor.py,
    ``FSDPActorConfig.__post_init__``): the deprecated ``actor.ulysses_sequence_parallel_size``, when above 1,
    is the actor's ``fsdp_config.ulysses_sequence_parallel_size``."""
    deprecated = flat.get("actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1)
    if isinstance(deprecated, int) and deprecated > 1:
        flat = {**flat, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": deprecated,
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1}
    return flat


def compose(args: list[str]) -> dict[str, Any]:
    """verl 0.9.1's composed config for the arguments of its command, resolved, as dotted keys (an empty
    dict or list stays one key). Raises HydraRefused where verl's Hydra refuses them."""
    config_name, overrides = _split_options(args)
    return _compose(config_name, tuple(overrides))


def known(value: Any) -> bool:
    """A value with no part the import keeps verbatim (the environment, ``$(...)``, the script's arguments)
    nor one bash got from the sandbox's environment (``env_value``)."""
    if isinstance(value, str):
        return "$" not in value and "_env_" not in value
    if isinstance(value, list):
        return all(known(v) for v in value)
    if isinstance(value, dict):
        return all(known(v) for v in value.values())
    return True


def same(imported: Any, composed: Any) -> bool:
    """Equal as verl reads them: a string field given a number holds its text; floats by value."""
    if isinstance(imported, str) and not isinstance(composed, str):
        return imported == (str(composed).lower() if isinstance(composed, bool) else str(composed)) or \
            parse_hydra_value(imported) == composed
    if isinstance(imported, bool) or isinstance(composed, bool):
        return imported is composed
    if isinstance(imported, (int, float)) and isinstance(composed, (int, float)):
        return float(imported) == float(composed)
    if isinstance(imported, list) and isinstance(composed, list):
        return len(imported) == len(composed) and all(same(a, b) for a, b in zip(imported, composed, strict=True))
    if isinstance(imported, dict) and isinstance(composed, dict):
        return imported.keys() == composed.keys() and all(same(imported[k], composed[k]) for k in imported)
    return imported == composed


def imported_keys(result: ImportResult) -> dict[str, Any]:
    """Every key the import holds, in verl's names: the spec's modelled keys (defaults included) and the
    pass-through keys, override_config leaves one per key."""
    flat = {VERL_NAMES.get(k, k): v for k, v in spec_to_flat(result.spec).items()
            if not k.startswith(("attnboard.", PASSTHROUGH + "."))}
    for key, value in result.spec.verl_passthrough.items():
        bare = key.lstrip("+")
        if isinstance(value, dict) and value:
            flat.update(flatten(value, bare + "."))
        else:
            flat[bare] = value
    return flat


def differences(result: ImportResult, composed: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose imported value differs from verl's composed one, where both are known."""
    out: dict[str, tuple[Any, Any]] = {}
    # Under another model_engine verl's config lacks some of dp's keys, which the spec always holds (at their
    # defaults; nothing reads them there): those are not compared.
    absent = ENGINE_ABSENT.get(str(result.spec.model_engine), ())
    for key, value in imported_keys(result).items():
        if key.startswith("hydra."):  # Hydra's own settings (hydra.run.dir): not part of the job's config
            continue
        if key in absent or key.startswith(tuple(a + "." for a in absent)):
            continue
        if key.endswith(".strategy") and str(result.spec.model_engine) in ENGINE_STRATEGY:
            value = ENGINE_STRATEGY[str(result.spec.model_engine)]  # the spec keeps it through model_engine
        if key not in composed:
            prefix = key + "."
            if isinstance(value, dict) and not value and not any(k.startswith(prefix) for k in composed):
                continue
            if not any(k.startswith(prefix) for k in composed):
                out[key] = (value, "<missing>")
            continue
        if known(value) and known(composed[key]) and not same(value, composed[key]):
            out[key] = (value, composed[key])
    return out


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between two composed configs (keys of either), ``attnboard.*`` apart (verl
    composes them with the + the export gives them, and ignores them)."""
    return {k: (a.get(k, "<missing>"), b.get(k, "<missing>")) for k in sorted(set(a) | set(b))
            if not k.startswith("attnboard.") and not same(a.get(k, "<missing>"), b.get(k, "<missing>"))}
