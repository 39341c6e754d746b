"""verl interop: a verl launch script, command line or YAML in, a RunSpec out, and back again.

Pure logic, no I/O. Three layers, each undone exactly by its inverse on export:

1. the shell: the text is read as bash reads it (``worker.interop.shell``: variables, ``${VAR:-default}``,
   arrays, ``$((...))``, quotes, continuations, pipes, ``if``/``for``); the ``python3 -m
   verl.trainer.main_ppo`` command's arguments are the overrides, every other command is ignored, and
   what cannot be known without running the script (the environment, ``$@``, ``$(date)``) is listed;
2. Hydra's override grammar: ``key=value``, ``+key=value`` (add), ``++key=value`` (add or replace),
   ``~key`` (delete), values typed as Hydra types them (null, bools, ints, floats, quoted strings,
   ``[lists]``, ``{dicts}``);
3. OmegaConf interpolations: ``${key}`` and ``${oc.select:key,default}``, resolved against the
   imported config; ``\\${`` is a literal ``${``.

Keys are checked against the spec (``worker.spec``) and against verl 0.9.1's generated default config
(``worker.spec.verl_defaults``): a key verl has but attnboard does not model is kept in the spec's
``verl_passthrough`` (passed through to verl, not run by attnboard) and exported unchanged, as is a key
given with ``+`` that verl's config lacks; a key neither knows, given without ``+``, is an error
suggesting the nearest valid key. Hydra's struct mode decides the ``+``: keys present in verl's default
config are written bare, keys that are not (every ``override_config`` sub-key, every ``attnboard.*``
key, every ``+`` pass-through key) need ``+``.

Split by concern: ``results`` (results, errors, messages), ``command`` (picking the verl command in a
script), ``hydra`` (the override grammar and interpolations), ``apply`` (overrides onto a spec),
``yaml_config`` (YAML in), ``export`` (command line and YAML out).
"""

from worker.core.limits import MAX_INPUT_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES
from worker.interop.verl.apply import KEPT_INTERPOLATIONS
from worker.interop.verl.command import import_command
from worker.interop.verl.export import export_command, export_yaml
from worker.interop.verl.hydra import Interpolation, decode_omegaconf, encode_omegaconf, hydra_value, parse_hydra_value
from worker.interop.verl.results import (
    ARGUMENTS_WARNING,
    ATTNBOARD_KEYS_WARNING,
    CRITIC_ATTN_WARNING,
    DEFAULT_ENTRYPOINT,
    ENTRY_MESSAGE,
    HF_ROLLOUT_WARNING,
    MAX_INTERPOLATION_DEPTH,
    MEGATRON_MESSAGE,
    NO_COMMAND_MESSAGE,
    ExportResult,
    ImportBudgetError,
    ImportResult,
    VerlImportError,
    engine_rollout_warning,
)
from worker.interop.verl.yaml_config import import_yaml
from worker.spec import VERL_NAMES

__all__ = [
    "ARGUMENTS_WARNING", "ATTNBOARD_KEYS_WARNING", "CRITIC_ATTN_WARNING", "DEFAULT_ENTRYPOINT", "ENTRY_MESSAGE",
    "HF_ROLLOUT_WARNING", "KEPT_INTERPOLATIONS", "MAX_INPUT_BYTES", "MAX_INTERPOLATION_DEPTH", "MAX_YAML_DEPTH",
    "MAX_YAML_NODES", "MEGATRON_MESSAGE", "NO_COMMAND_MESSAGE", "VERL_NAMES", "ExportResult", "ImportBudgetError",
    "ImportResult", "Interpolation", "VerlImportError", "decode_omegaconf", "encode_omegaconf", "engine_rollout_warning",
    "export_command", "export_yaml", "hydra_value", "import_command", "import_yaml", "parse_hydra_value",
]

