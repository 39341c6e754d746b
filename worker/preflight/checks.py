"""``preflight(spec, environment, preview_issues, resolution, facts)``: every problem this launch would hit on
its target, each with the dotted key, the value, why, and a value that runs here (``suggested``).

Pure: the facts that need I/O (can the engine find each model folder and data file, what the cluster has
in all) come in ``Facts``, gathered by the caller (``app.services.preflight``). ``adapt_patch`` is
"adapt to this target": the suggested values as one patch of dotted keys.

Order of the findings: what refuses the spec (the preview's errors, attention first), then what the
target lacks (device, resources), then what the engine cannot find (models, data), then verl's
placeholder defaults the spec kept."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from worker.attention.resolution import Resolution, Status
from worker.core.devices import run_resources
from worker.core.environment import Environment
from worker.spec import Issue, RunSpec
from worker.spec.verl_defaults import VERL_DEFAULTS
from worker.troubleshoot.classify import eager_remedy

BUILTIN_MODEL = "builtin:tiny-llama"
BUILTIN_DATA = "builtin:count"
"""What a model or data file that cannot be found here is replaced with: the built-in preset and task,
which every node has (the tiny CPU preset's, ``worker.spec.presets``)."""

MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path")
DATA_KEY = "data.train_files"
DEVICE_KEY = "trainer.device"
RANKS_KEY = "trainer.n_gpus_per_node"
NODES_KEY = "trainer.nnodes"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")
"""``Qwen/Qwen2.5-0.5B-Instruct``: a Hugging Face Hub id, not a folder (a folder is absolute or starts with ~ or .)."""


@dataclass(frozen=True)
class Facts:
    """What the caller found out with I/O. ``model_problems``: dotted model key -> why the engine cannot load
    that folder (absent: it can); ``data_problems``: data file -> why it cannot be read; ``cluster_total``:
    the resources the cluster has in all (None: not known, e.g. Ray unreachable)."""

    model_problems: Mapping[str, str] = field(default_factory=dict)
    data_problems: Mapping[str, str] = field(default_factory=dict)
    cluster_total: Mapping[str, float] | None = None


@dataclass(frozen=True)
class Finding:
    key: str
    value: Any
    problem: str
    suggested: Any = None  # a value that runs on this target; None: no value to propose (read ``problem``)
    kind: str = "spec"  # attention | spec | device | resources | model | data | verl_default
    blocking: bool = True  # the launch would fail, or never start; False: it runs, but not as meant

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Preflight:
    target: str
    findings: list[Finding]
    remedy: dict[str, Any] | None = None
    """The attention remedy (``eager_remedy``) when roles cannot run: ``{"patch", "sentence"}``."""

    @property
    def ok(self) -> bool:
        return not any(f.blocking for f in self.findings)

    @property
    def never_fits(self) -> list[Finding]:
        return [f for f in self.findings if f.kind == "resources"]

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "ok": self.ok, "findings": [f.as_dict() for f in self.findings],
                "adapt": adapt_patch(self), "remedy": self.remedy}


def adapt_patch(result: Preflight) -> dict[str, Any]:
    """"Adapt to this target": every suggested value, as one patch of dotted keys (applied in one click)."""
    return {f.key: f.suggested for f in result.findings if f.suggested is not None}


def is_hub_id(path: str) -> bool:
    return bool(HUB_ID.match(path)) and not path.startswith(("builtin:", "~", ".", "/"))


def preflight(spec: RunSpec, environment: Environment, *, issues: list[Issue], resolution: Resolution,
              facts: Facts) -> Preflight:
    """Every finding for ``spec`` launched on ``environment`` (``issues`` and ``resolution``: its preview)."""
    findings: list[Finding] = []
    failing = [r.role for r in resolution.roles.values() if r.status == Status.error.value]
    remedy = None
    if failing:
        fix = eager_remedy(failing)
        remedy = {"patch": fix.patch, "sentence": fix.sentence, "roles": failing}
        rows = {r.role: r for r in resolution.roles.values() if r.role in failing}
        for key, value in fix.patch.items():
            section = key.split(".", 1)[0]
            roles = [r for r in failing if (r == "critic") == (section == "critic")]
            by_error: dict[str, list[str]] = {}
            for role in roles:
                by_error.setdefault(rows[role].error or rows[role].reasons[-1].text, []).append(role)
            why = "; ".join(f"{', '.join(who)}: {error}" for error, who in by_error.items())
            requested = rows[roles[0]].requested
            findings.append(Finding(key, requested, f"{requested} cannot run on {resolution.environment} (policy "
                                    f"{resolution.policy}): {why}", value, kind="attention"))
    findings += [Finding(i.field, i.value, i.message, i.valid if isinstance(i.valid, (str, int, float)) else None)
                 for i in issues if i.severity == "error"]
    device = spec.trainer.device.value if hasattr(spec.trainer.device, "value") else str(spec.trainer.device)
    if device != environment.device:
        findings.append(Finding(DEVICE_KEY, device, f"ranks on {device} cannot start on the target {environment.name}, "
                                f"a {environment.device.upper()} node", environment.device, kind="device"))
    findings += resource_findings(spec, environment.device, facts.cluster_total)
    findings += _models(spec, facts)
    findings += _data(spec, facts)
    return Preflight(target=environment.name, findings=findings, remedy=remedy)


def resource_findings(spec: RunSpec, device: str, total: Mapping[str, float] | None) -> list[Finding]:
    """Resources the cluster can never offer (``total``: what it has in all; None: unknown) to the ranks on
    ``device``, with the rank count that fits."""
    if total is None:
        return []
    nodes, per_node = spec.trainer.nnodes, spec.trainer.n_gpus_per_node
    # a derived attnboard.rank_cpus (0) shrinks to what is free, down to 1 CPU a rank; a set one is what each asks
    need = run_resources(device, nodes * per_node, spec.attnboard.rank_cpus or 1)
    short = {k: v for k, v in need.items() if total.get(k, 0.0) < v}
    if not short:
        return []
    have = ", ".join(f"{total.get(k, 0.0):g} {k}" for k in short)
    want = ", ".join(f"{v:g} {k}" for k, v in short.items())
    fit = int(min(total.get(k, 0.0) for k in need) // nodes)
    problem = (f"{nodes} x {per_node} ranks ask for {want}, more than the cluster has in all ({have}): the run "
               f"would wait forever")
    if fit >= 1:
        return [Finding(RANKS_KEY, per_node, problem, fit, kind="resources")]
    if nodes > 1 and int(min(total.get(k, 0.0) for k in need)) >= 1:
        return [Finding(NODES_KEY, nodes, problem, 1, kind="resources")]
    return [Finding(RANKS_KEY, per_node, problem + f"; no {'/'.join(short)} at all", None, kind="resources")]


def _models(spec: RunSpec, facts: Facts) -> list[Finding]:
    out: list[Finding] = []
    actor_path = spec.actor_rollout_ref.model.path
    actor_ok = MODEL_KEYS[0] not in facts.model_problems
    for key in MODEL_KEYS if spec.has_critic else MODEL_KEYS[:1]:
        path = actor_path if key == MODEL_KEYS[0] else spec.critic.model.path
        placeholder = path == VERL_DEFAULTS.get(key)
        if key == MODEL_KEYS[1] and placeholder and path != actor_path:
            out.append(Finding(key, path, "holds verl's default: nothing set it (a launch script that does not name the "
                               "critic's model gets verl's placeholder)", actor_path if actor_ok else BUILTIN_MODEL,
                               kind="verl_default", blocking=key in facts.model_problems))
            continue
        problem = facts.model_problems.get(key)
        if problem is None:
            continue
        if is_hub_id(path):
            problem = (f"{path!r} is a Hugging Face Hub id: attnboard's engine loads local model folders only and "
                       f"downloads nothing (an offline node); {problem}")
        elif placeholder:
            problem = f"holds verl's default, a placeholder; {problem}"
        out.append(Finding(key, path, problem, BUILTIN_MODEL, kind="model"))
    return out


def _data(spec: RunSpec, facts: Facts) -> list[Finding]:
    files = spec.data.train_files if isinstance(spec.data.train_files, list) else [spec.data.train_files]
    missing = [f for f in files if f in facts.data_problems]
    if not missing:
        return []
    why = "; ".join(facts.data_problems[f] for f in missing)
    value = spec.data.train_files
    return [Finding(DATA_KEY, value, why, BUILTIN_DATA, kind="data")]
