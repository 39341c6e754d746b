"""The troubleshooting classifier: from an error (and what is known of the node) to a diagnosis and a remedy.

Pure: no I/O. ``classify(error, env, role=...)`` matches the error's text against an ordered table of
rules (``RULES``), first match wins, and returns a ``Diagnosis``: a ``Category``, the step of the seed's
troubleshooting order it belongs to (check compatibility -> fall back to eager -> check hardware -> read
the error), a ``Remedy`` (a patch of dotted spec keys plus one sentence) and the condition under which a
later probe shows the cause gone, so the app can suggest returning to the fast path
(``suggest_return_to_fast_path``). The node is a ``worker.core.environment.Environment`` (a profile or a
probe), the same one the preview and the availability check read.

The messages recognised are those in ATTENTION_RULES.md, in transformers 4.x and 5.x wording, plus the
exact strings of transformers 5.24 (``modeling_utils._flash_attn_import_error``,
``_flash_attn_can_dispatch``, ``_sdpa_can_dispatch``, ``get_correct_attn_implementation``,
``integrations/hub_kernels.py``), flash-attn's own kernel errors, torch's flex-attention and allocator
errors, and Hydra's struct-mode override errors.

The remedy follows the guide's order (check compatibility -> eager -> hardware -> read the error): an
implementation that cannot run gets eager on its role's setting (``remedies.eager_remedy``, the one rule the
run page's retry button and the preview's preflight apply too), and the entry says when to return to the fast
path once the cause is fixed.

The parts, by concern: ``diagnosis`` (the vocabulary and the answer), ``remedies`` (spec keys, patches and
what a match tells), ``builders`` (one per kind of fix), ``rules`` (the ordered table and ``classify``),
``fast_path`` (conditions of a later probe). This module is their public face.
"""

from __future__ import annotations

from worker.troubleshoot.diagnosis import CATEGORY_STEP, Category, Diagnosis, ErrorInfo, Remedy, Step
from worker.troubleshoot.fast_path import (
    CONDITIONS,
    conditions_met,
    fast_path_implementation,
    fast_path_patch,
    suggest_return_to_fast_path,
)
from worker.troubleshoot.remedies import (
    ACTOR_SP_KEY,
    ATTN_KEY,
    DTYPE_KEYS,
    HALF_DTYPE,
    ROLE_SECTIONS,
    attn_patch,
    dtype_patch,
    eager_remedy,
)
from worker.troubleshoot.rules import MAX_HEAD_CHARS, MAX_TRACEBACK_CHARS, RULES, Rule, classify

__all__ = ["ACTOR_SP_KEY", "ATTN_KEY", "CATEGORY_STEP", "CONDITIONS", "DTYPE_KEYS", "HALF_DTYPE", "MAX_HEAD_CHARS",
           "MAX_TRACEBACK_CHARS", "ROLE_SECTIONS", "RULES",
           "Category", "Diagnosis", "ErrorInfo", "Remedy", "Rule", "Step", "attn_patch", "classify", "conditions_met",
           "dtype_patch", "eager_remedy", "fast_path_implementation", "fast_path_patch", "suggest_return_to_fast_path"]
