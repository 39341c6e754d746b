"""What the live run page shows, folded from the run's events. Pure: events in, view state out.

The page renders the fold of every stored event; the event stream folds the same way one event at a
time and sends the blocks that event changed, so the page and the stream can never disagree.

Payloads are the engine's (documented at the top of ``worker/engine/events.py``) as the pump stores
them (``app.services.pump.to_event_create``: a status payload carries ``state`` and ``status``).
Unknown or malformed fields are shown as absent, never trusted as markup.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from worker.core import roles
from worker.core.attention_payload import AttentionPayload
from worker.core.contract import TERMINAL, RunState
from worker.core.events import read_attention
from worker.core.roles import Role

EAGER_RETRY_STATUSES = frozenset({RunState.failed.value})
"""The statuses a retry with a remedy ("retry with eager", a troubleshooting entry's "Retry with this remedy")
is offered on: a run that failed. One that succeeded after a fallback has nothing to retry (the fallback
already runs); its pages offer the return to the fast path only when a probe shows the cause gone."""


def offers_retry(status: str | None) -> bool:
    """Whether a run in ``status`` is offered a retry with a remedy (``EAGER_RETRY_STATUSES``): the run page's
    eager remedy, the runs list's quick retry and the troubleshooting entries' "Retry with this remedy"."""
    return status in EAGER_RETRY_STATUSES

TROUBLE_KINDS = frozenset({"fallback", "error", "attention_mismatch", "restart"})
# The role whose setting decides each role's attention: rollout and reference share the actor's section.
SETTING_OF = {role.value: role.setting.value for role in Role}
# Worst first: a role's badge across its ranks is the worst any rank reported.
BADGE_SEVERITY = ("error", "fallback", "forced", "override", "default", "ok")


@dataclass(frozen=True)
class Chart:
    """One chart: the metric names (``metric`` payload ``values``) drawn as lines, and optionally a
    per-rank map of the payload (``peak_memory_mb``) drawn as one line per rank."""

    id: str
    title: str
    keys: tuple[str, ...]
    per_rank: str | None = None


CHARTS: tuple[Chart, ...] = (
    Chart("reward", "Reward", ("critic/rewards/mean", "critic/score/mean")),
    Chart("kl", "KL", ("actor/kl", "actor/ppo_kl")),
    Chart("loss", "Losses", ("actor/pg_loss", "critic/vf_loss")),
    Chart("throughput", "Tokens/s", ("perf/tokens_per_s",)),
    Chart("step-time", "Step time (s)", ("perf/step_time_s",)),
    Chart("memory", "Peak memory (MiB)", ("perf/max_memory_mb",), per_rank="peak_memory_mb"),
    Chart("probs-diff", "Rollout vs training log-prob difference", ("training/rollout_probs_diff_mean",)),
)
REWARD_KEYS = CHARTS[0].keys
TOKENS_PER_S, STEP_TIME_S, MAX_MEMORY_MB = "perf/tokens_per_s", "perf/step_time_s", "perf/max_memory_mb"


def rank_key(per_rank: str, rank: str) -> str:
    """The name a per-rank value gets among a metric point's values: ``peak_memory_mb/rank 0``."""
    return f"{per_rank}/rank {rank}"


RULE_ID = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
"""A resolution rule's id (``override``, ``forced-eager-fsdp-turbo-ulysses``), as reasons start with it."""
SDPA_BACKEND_WORDS = {
    "flash_attention": "torch's built-in FlashAttention kernel, not the flash-attn package",
    "efficient_attention": "torch's memory-efficient kernel",
    "cudnn_attention": "cuDNN's attention kernel",
    "math": "plain matrix products, the slowest path",
}
"""The backends of ``torch.nn.functional.scaled_dot_product_attention``, in words."""


@dataclass
class AttentionRow:
    """One role on one rank, from its ``attention`` event (or its ``error`` event when it never loaded): the
    payload's fields (``AttentionPayload``, read as attributes of the row) and what the page adds."""

    payload: AttentionPayload
    reasons: list[str] = field(default_factory=list)
    """The payload's reasons as sentences (``rule: text``)."""
    before: AttentionRow | None = None
    """The same role and rank before the latest restart, when it ran elsewhere or with another kernel."""

    def __getattr__(self, name: str) -> Any:  # the payload's fields, without listing them again
        if name == "payload":
            raise AttributeError(name)
        return getattr(self.payload, name)

    def fields(self) -> list[tuple[str, Any]]:
        """Every field of the payload with its value, for the row's details."""
        return list(self.payload.as_dict().items())

    @property
    def sdpa_reason(self) -> str | None:
        """Why the SDPA backend was math."""
        return self.payload.sdpa_backend_reason

    @property
    def sdpa_op(self) -> str | None:
        """The aten op that named the SDPA backend."""
        return next((r["op"] for r in self.payload.sdpa if isinstance(r.get("op"), str) and r["op"]), None)

    @property
    def precision(self) -> str | None:
        """``bf16 / fp32``: compute over weights as held."""
        if not self.compute_dtype:
            return None
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
        held = short.get(self.weights_dtype or "", self.weights_dtype)
        return f"{short.get(self.compute_dtype, self.compute_dtype)}" + (f" / {held}" if held else "")

    @property
    def reason_items(self) -> list[tuple[str | None, str]]:
        """Each reason as (rule id, sentence), the rule shown apart as in the preview; None where it has none."""
        items: list[tuple[str | None, str]] = []
        for reason in self.reasons:
            rule, sep, text = reason.partition(": ")
            items.append((rule, text) if sep and RULE_ID.fullmatch(rule) else (None, reason))
        return items

    @property
    def sdpa_backend_words(self) -> str | None:
        """What the SDPA backend that ran is, in words: ``flash_attention`` on a CPU is torch's own fused
        kernel for CPU (the aten op ``..._flash_attention_for_cpu``), not the flash-attn package."""
        if not self.sdpa_backend:
            return None
        if self.sdpa_backend == "flash_attention" and (self.sdpa_op or "").endswith("_for_cpu"):
            return "torch's own fused kernel for CPU, not the flash-attn package"
        return SDPA_BACKEND_WORDS.get(self.sdpa_backend)

    @property
    def changed(self) -> bool:
        """After a restart this rank loaded or ran another implementation than before."""
        return self.before is not None and (self.before.effective, self.before.observed) != (self.effective,
                                                                                            self.observed)

    @property
    def badge(self) -> str:
        """default / override / forced / fallback (and error for a role that did not load)."""
        if self.status == "error":
            return "error"
        if self.fallback or self.status == "fallback":
            return "fallback"
        if self.forced or self.status == "forced":
            return "forced"
        return self.source if self.source in ("default", "override") else "ok"

    @property
    def disagrees(self) -> bool:
        """The preview predicted another implementation than the one that loaded."""
        return bool(self.predicted and self.effective and self.predicted != self.effective)


@dataclass
class LogEntry:
    seq: int
    ts: datetime | None
    kind: str
    message: str
    detail: dict[str, Any]
    role: str | None = None
    rank: int | None = None
    summary: str | None = None
    remedy: str | None = None


@dataclass
class RunView:
    status: str = "queued"
    reason: str | None = None
    step: int = 0
    total_steps: int | None = None
    started: datetime | None = None
    last_ts: datetime | None = None
    last_seq: int = 0
    attention: dict[tuple[str, int | None], AttentionRow] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    trouble: list[LogEntry] = field(default_factory=list)
    logs: list[LogEntry] = field(default_factory=list)
    restarts: list[LogEntry] = field(default_factory=list)
    """The ``restart`` events: the run started again on new ranks (cause, step it resumed from)."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def fraction(self) -> float | None:
        if self.status == "succeeded":
            return 1.0
        if not self.total_steps:
            return None
        return min(1.0, self.step / self.total_steps)

    @property
    def eta_seconds(self) -> float | None:
        """Time left at the pace so far: elapsed / steps done x steps left."""
        if self.terminal or not self.total_steps or not self.step or not self.started or not self.last_ts:
            return None
        elapsed = (self.last_ts - self.started).total_seconds()
        return max(0.0, elapsed / self.step * (self.total_steps - self.step))

    def attention_rows(self) -> list[AttentionRow]:
        return sorted(self.attention.values(), key=lambda r: (roles.order(r.role), r.role, r.rank if r.rank is not None else -1))

    def forced_rows(self) -> list[AttentionRow]:
        """One row per role that was forced (rank 0's, or the first rank seen)."""
        seen: dict[str, AttentionRow] = {}
        for row in self.attention_rows():
            if row.badge == "forced":
                seen.setdefault(row.role, row)
        return list(seen.values())

    def eager_retry_roles(self) -> list[str]:
        """The settings (``actor``, ``critic``) worth retrying with eager: the run failed (``EAGER_RETRY_STATUSES``),
        a role they decide fell back or did not load, and it does not already run eager."""
        wanted: list[str] = []
        if not offers_retry(self.status):
            return wanted
        troubled = {(r.role, r.effective) for r in self.attention.values() if r.badge in ("fallback", "error")}
        troubled |= {(e.role, None) for e in self.trouble if e.kind in ("fallback", "error") and e.role}
        for role, effective in troubled:
            setting = SETTING_OF.get(role)
            if setting and effective != "eager" and setting not in wanted:
                wanted.append(setting)
        return sorted(wanted, key=roles.order)

    def role_badges(self) -> list[RoleBadge]:
        return badges_of(self.attention.values())

    def fell_back(self, role: str) -> bool:
        return any(r.role == role and r.badge == "fallback" for r in self.attention.values()) or any(
            e.kind == "fallback" and e.role == role for e in self.trouble)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else (None if value is None else str(value))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reasons(value: Any) -> list[str]:
    if isinstance(value, list):
        return [_reason_text(r) for r in value]
    return [] if value is None else [str(value)]


def _reason_text(reason: Any) -> str:
    if isinstance(reason, dict):
        rule, text = reason.get("rule"), reason.get("text")
        return f"{rule}: {text}" if rule else str(text)
    return str(reason)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def attention_row(payload: dict[str, Any]) -> AttentionRow:
    """An ``attention`` payload as a table row (read leniently: a malformed field shows as absent)."""
    return AttentionRow(read_attention(payload), reasons=_reasons(payload.get("reasons")))


def failed_role_row(payload: dict[str, Any]) -> AttentionRow | None:
    """An ``error`` payload of a role that could not load (it names ``role``) as that role's row."""
    role = _str(payload.get("role"))
    if not role:
        return None
    attempts = [a for a in payload.get("attempts") or [] if isinstance(a, dict)]
    diagnosis = _dict(payload.get("diagnosis"))
    summary = _str(diagnosis.get("summary")) or _str(payload.get("message")) or ""
    reasons = [f"tried {', '.join(str(a.get('implementation')) for a in attempts)}"] if attempts else []
    if summary:
        reasons.append(summary)
    return AttentionRow(AttentionPayload(role=role, rank=_int(payload.get("rank")), status="error",
                                         requested=_str(attempts[0].get("implementation")) if attempts else None),
                        reasons=reasons)


def _log_entry(seq: int, ts: datetime | None, kind: str, payload: dict[str, Any]) -> LogEntry:
    diagnosis = _dict(payload.get("diagnosis"))
    remedy = _dict(diagnosis.get("remedy"))
    if kind == "fallback":
        message = f"{_str(payload.get('from')) or '?'} → {_str(payload.get('to')) or '?'}: {_str(payload.get('error')) or ''}"
    else:
        message = _str(payload.get("message")) or _str(payload.get("error")) or ""
    return LogEntry(seq=seq, ts=ts, kind=kind, message=message.strip(), detail=payload,
                    role=_str(payload.get("role")), rank=_int(payload.get("rank")),
                    summary=_str(diagnosis.get("summary")), remedy=_str(remedy.get("sentence")))


def metric_point(seq: int, payload: dict[str, Any]) -> dict[str, Any] | None:
    """A ``metric`` payload as a chart point ``{step, seq, values}``; per-rank maps (``peak_memory_mb``)
    become one value per rank (``peak_memory_mb/rank 0``). None without a step."""
    step = _int(payload.get("step"))
    if step is None:
        return None
    values = {str(k): v for k, v in _dict(payload.get("values")).items() if _number(v)}
    for chart in CHARTS:
        if chart.per_rank:
            for rank, v in _dict(payload.get(chart.per_rank)).items():
                if _number(v):
                    values[rank_key(chart.per_rank, str(rank))] = v
    return {"step": step, "seq": seq, "values": values}


# The figures a step's log line names, in order: (metric, how it reads).
STEP_LINE = (("critic/rewards/mean", "reward {:.4g}"), ("actor/pg_loss", "policy loss {:.4g}"),
             ("critic/vf_loss", "value loss {:.4g}"), ("actor/kl", "KL {:.3g}"), ("perf/tokens_per_s", "{:.0f} tokens/s"),
             ("perf/step_time_s", "{:.2f} s"), ("perf/max_memory_mb", "peak {:.0f} MiB"))


def step_line(point: dict[str, Any], total_steps: int | None) -> str:
    """A metric point as the worker log's line: ``step 3 of 12: reward 0.057, ..., 1.92 s, peak 450 MiB``."""
    values = point["values"]
    figures = [text.format(values[key]) for key, text in STEP_LINE if key in values]
    of = f" of {total_steps}" if total_steps else ""
    return f"step {point['step']}{of}" + (": " + ", ".join(figures) if figures else "")


def metrics_csv(points: Iterable[dict[str, Any]]) -> str:
    """Metric points (``metric_point``) as CSV: a ``step`` column, then one column per metric name (sorted),
    empty where a step lacks that metric."""
    points = list(points)
    keys = sorted({k for p in points for k in p["values"]})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *keys])
    for p in points:
        writer.writerow([p["step"], *(p["values"].get(k, "") for k in keys)])
    return out.getvalue()


def apply_event(view: RunView, *, seq: int, kind: str, payload: dict[str, Any], ts: datetime | None = None) -> RunView:
    """Fold one event into ``view`` (in place, returned for chaining). Events at or below
    ``view.last_seq`` are ignored, so replaying a stream is harmless."""
    if seq <= view.last_seq:
        return view
    view.last_seq = seq
    view.last_ts = ts or view.last_ts
    payload = payload if isinstance(payload, dict) else {}
    if kind == "status":
        view.status = _str(payload.get("state")) or _str(payload.get("status")) or view.status
        view.reason = _str(payload.get("reason"))
        if view.status == "running" and view.started is None:
            view.started = ts
        view.total_steps = _int(payload.get("total_steps")) or view.total_steps
    elif kind == "metric":
        point = metric_point(seq, payload)
        if point is not None:
            view.step = max(view.step, point["step"])
            view.total_steps = _int(payload.get("total_steps")) or view.total_steps
            view.metrics.append(point)
            view.logs.append(LogEntry(seq=seq, ts=ts, kind="step", message=step_line(point, view.total_steps),
                                      detail={}))
            if view.started is None:
                view.started = ts
    elif kind == "attention":
        row = attention_row(payload)
        earlier = view.attention.get((row.role, row.rank))
        if earlier is not None and earlier.attempt < row.attempt and (
                (earlier.node, earlier.effective, earlier.observed) != (row.node, row.effective, row.observed)):
            earlier.before = None
            row.before = earlier  # a restarted rank that landed elsewhere or ran another kernel: shown
        view.attention[(row.role, row.rank)] = row
    elif kind == "env_probe":
        view.probe = payload
    elif kind in TROUBLE_KINDS or kind == "log":
        entry = _log_entry(seq, ts, kind, payload)
        (view.trouble if kind in TROUBLE_KINDS else view.logs).append(entry)
        if kind == "restart":
            view.restarts.append(entry)
        failed = failed_role_row(payload) if kind == "error" else None
        if failed is not None and (failed.role, failed.rank) not in view.attention:
            view.attention[(failed.role, failed.rank)] = failed
    return view


def fold(events: Iterable[Any], *, total_steps: int | None = None, status: str | None = None) -> RunView:
    """The view after ``events`` (objects with seq, kind, payload, ts), oldest first."""
    view = RunView(total_steps=total_steps, status=status or "queued")
    for ev in events:
        apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts)
    if status:
        view.status = status  # the run row is the authority on the current status
    return view


# --------------------------------------------------------------------------------------------
# Runs list: one badge per role


@dataclass(frozen=True)
class RoleBadge:
    role: str
    requested: str | None
    effective: str | None
    badge: str
    ranks: int


def role_badges(events: Iterable[tuple[str, dict[str, Any]]]) -> list[RoleBadge]:
    """Per role, from its ``attention`` and ``error`` events ``(kind, payload)``: what it asked for, what
    ran, and the worst badge any rank reported (a fallback on one rank is a fallback)."""
    rows: dict[tuple[str, int | None], AttentionRow] = {}
    for kind, payload in events:
        payload = _dict(payload)
        if kind == "attention":
            row = attention_row(payload)
            rows[(row.role, row.rank)] = row
        elif kind == "error":
            failed = failed_role_row(payload)
            if failed is not None:
                rows.setdefault((failed.role, failed.rank), failed)
    return badges_of(rows.values())


def badges_of(rows: Iterable[AttentionRow]) -> list[RoleBadge]:
    """One badge per role, the worst its ranks reported, in role order."""
    by_role: dict[str, list[AttentionRow]] = {}
    for row in rows:
        by_role.setdefault(row.role, []).append(row)
    out = []
    for role in sorted(by_role, key=lambda r: (roles.order(r), r)):
        worst = min(by_role[role], key=lambda r: (BADGE_SEVERITY.index(r.badge), r.rank if r.rank is not None else -1))
        out.append(RoleBadge(role=role, requested=worst.requested, effective=worst.effective, badge=worst.badge,
                             ranks=len(by_role[role])))
    return out


def eager_settings(badges: Iterable[RoleBadge], status: str) -> list[str]:
    """The settings (``actor``, ``critic``) a "retry with eager" is offered for: the run in ``status``
    failed (``EAGER_RETRY_STATUSES``), one of their roles fell back or did not load, and it did not end on
    eager anyway."""
    if not offers_retry(status):
        return []
    wanted = {SETTING_OF[b.role] for b in badges
              if b.role in SETTING_OF and b.badge in ("fallback", "error") and b.effective != "eager"}
    return sorted(wanted, key=roles.order)


# --------------------------------------------------------------------------------------------
# Numbers for the compare page


def series(view: RunView, keys: Iterable[str]) -> list[tuple[int, float]]:
    """(step, value) of the first of ``keys`` each point has."""
    keys = tuple(keys)
    out = []
    for point in view.metrics:
        value = next((point["values"][k] for k in keys if k in point["values"]), None)
        if value is not None:
            out.append((point["step"], value))
    return out


def metric_names(views: Iterable[RunView]) -> list[str]:
    """Every metric name any of the views has a point of, sorted."""
    return sorted({k for v in views for point in v.metrics for k in point["values"]})


def mean_of(view: RunView, key: str) -> float | None:
    found = [v for _, v in series(view, [key])]
    return sum(found) / len(found) if found else None


def max_of(view: RunView, key: str) -> float | None:
    found = [v for _, v in series(view, [key])]
    return max(found) if found else None


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def spec_differences(flats: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """Keys whose values differ between the runs' flattened specs, in key order."""
    keys = sorted(set().union(*flats)) if flats else []
    return [(k, [f.get(k) for f in flats]) for k in keys if len({repr(f.get(k)) for f in flats}) > 1]


def aligned_series(curves: list[tuple[str, list[tuple[int, float]]]]) -> dict[str, Any]:
    """Curves with their own steps -> one x axis (the union of steps) and one value list per curve,
    None where a curve has no point (what uPlot draws as a gap)."""
    xs = sorted({step for _, points in curves for step, _ in points})
    out = []
    for label, points in curves:
        by_step = dict(points)
        out.append({"label": label, "values": [by_step.get(x) for x in xs]})
    return {"x": xs, "series": out}
