"""The run spec: verl's vocabulary with attnboard's keys, parsed and checked (pure, no I/O).

The package's public names: the models (``schema``), the dotted keys (``keys``), the pass-through's checks
(``passthrough``), ``RunSpec`` (``runspec``), parsing (``parse``) and the cross-field rules (``checks``).
"""

from worker.core.vocabulary import ModelInfo
from worker.spec.checks import SP_PADDING_MESSAGE, TURBO_CONFLICT_MESSAGE, check_spec, validate_spec
from worker.spec.keys import (
    ALIASES,
    OPEN_DICT_FIELDS,
    REMOVE,
    SPEC_KEYS,
    SPEC_NAMES,
    VERL_NAMES,
    classify_key,
    flatten,
    nearest_key,
    nearest_verl_key,
    needs_plus,
    tree_get,
    tree_set,
    typed_like_verl,
    unflatten,
)
from worker.spec.parse import parse_spec
from worker.spec.runspec import RunSpec, spec_to_flat, spec_to_tree
from worker.spec.schema import (
    DEFAULT_LOCAL_DIR,
    ENGINE_KL_TYPES,
    PASSTHROUGH,
    PASSTHROUGH_NOTE,
    AdvEstimator,
    AttnboardSection,
    Issue,
    KLType,
    SpecError,
    Strategy,
)

__all__ = [
    "ALIASES",
    "DEFAULT_LOCAL_DIR",
    "ENGINE_KL_TYPES",
    "OPEN_DICT_FIELDS",
    "PASSTHROUGH",
    "PASSTHROUGH_NOTE",
    "REMOVE",
    "SPEC_KEYS",
    "SPEC_NAMES",
    "SP_PADDING_MESSAGE",
    "TURBO_CONFLICT_MESSAGE",
    "VERL_NAMES",
    "AdvEstimator",
    "AttnboardSection",
    "Issue",
    "KLType",
    "ModelInfo",
    "RunSpec",
    "SpecError",
    "Strategy",
    "check_spec",
    "classify_key",
    "flatten",
    "nearest_key",
    "nearest_verl_key",
    "needs_plus",
    "parse_spec",
    "spec_to_flat",
    "spec_to_tree",
    "tree_get",
    "tree_set",
    "typed_like_verl",
    "unflatten",
    "validate_spec",
]
