"""What the live run page shows, folded from the run's events. Pure: events in, view state out.

The page renders the fold of every stored event; the event stream folds the same way one event at a
time and sends the blocks that event changed, so the page and the stream can never disagree.
Event payloads follow PRODUCT.md's contract; unknown or malformed fields are shown as absent, never
trusted as markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
TROUBLE_KINDS = frozenset({"fallback", "error"})

# Chart id -> (title, regular expression over metric keys). Shared by the live and compare pages.
CHARTS: tuple[tuple[str, str, str], ...] = (
    ("reward", "Reward", "reward|score"),
    ("kl", "KL", "kl"),
    ("loss", "Losses", "loss"),
    ("throughput", "Tokens/s", "tokens_per_s|tokens/s|throughput"),
    ("memory", "Peak memory", "mem"),
)


@dataclass
class AttentionRow:
    role: str
    rank: int | None
    requested: str | None
    effective: str | None
    observed: str | None
    status: str
    forced: bool
    reasons: list[str]


@dataclass
class LogEntry:
    seq: int
    ts: datetime | None
    kind: str
    message: str
    detail: dict[str, Any]


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
        order = {"actor": 0, "rollout": 1, "reference": 2, "critic": 3}
        return sorted(self.attention.values(), key=lambda r: (order.get(r.role, 9), r.role, r.rank if r.rank is not None else -1))

    def fell_back(self, role: str) -> bool:
        return any(r.role == role and r.status == "fallback" for r in self.attention.values()) or any(
            e.kind == "fallback" and e.detail.get("role") == role for e in self.trouble)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else (None if value is None else str(value))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def apply_event(view: RunView, *, seq: int, kind: str, payload: dict[str, Any], ts: datetime | None = None) -> RunView:
    """Fold one event into ``view`` (in place, returned for chaining). Events at or below
    ``view.last_seq`` are ignored, so replaying a stream is harmless."""
    if seq <= view.last_seq:
        return view
    view.last_seq = seq
    view.last_ts = ts or view.last_ts
    payload = payload if isinstance(payload, dict) else {}
    if kind == "status":
        view.status = _str(payload.get("status")) or view.status
        view.reason = _str(payload.get("reason"))
        if view.status == "running" and view.started is None:
            view.started = ts
        total = _int(payload.get("total_steps"))
        if total:
            view.total_steps = total
    elif kind == "metric":
        step = _int(payload.get("step"))
        values = payload.get("values")
        if not isinstance(values, dict):
            values = {k: v for k, v in payload.items() if k != "step"}
        numbers = {str(k): v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if step is not None:
            view.step = max(view.step, step)
            view.metrics.append({"step": step, "seq": seq, "values": numbers})
            if view.started is None:
                view.started = ts
    elif kind == "attention":
        role = _str(payload.get("role")) or "?"
        rank = _int(payload.get("rank"))
        reasons = payload.get("reasons") or []
        view.attention[(role, rank)] = AttentionRow(
            role=role,
            rank=rank,
            requested=_str(payload.get("requested")),
            effective=_str(payload.get("effective")),
            observed=_str(payload.get("observed") or payload.get("observed_kernel")),
            status=_str(payload.get("status")) or ("forced" if payload.get("forced") else "ok"),
            forced=bool(payload.get("forced")),
            reasons=[_reason_text(r) for r in reasons] if isinstance(reasons, list) else [str(reasons)],
        )
    elif kind == "env_probe":
        view.probe = payload
    elif kind in TROUBLE_KINDS or kind == "log":
        entry = LogEntry(seq=seq, ts=ts, kind=kind, message=_str(payload.get("message") or payload.get("error") or payload.get("text")) or "",
                         detail=payload)
        (view.trouble if kind in TROUBLE_KINDS else view.logs).append(entry)
    return view


def _reason_text(reason: Any) -> str:
    if isinstance(reason, dict):
        rule, text = reason.get("rule"), reason.get("text")
        return f"{rule}: {text}" if rule else str(text)
    return str(reason)


def fold(events: list[Any], *, total_steps: int | None = None, status: str | None = None) -> RunView:
    """The view after ``events`` (objects with seq, kind, payload, ts), oldest first."""
    view = RunView(total_steps=total_steps, status=status or "queued")
    for ev in events:
        apply_event(view, seq=ev.seq, kind=ev.kind, payload=ev.payload, ts=ev.ts)
    if status:
        view.status = status  # the run row is the authority on the current status
    return view


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(round(seconds))
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
    series = []
    for label, points in curves:
        by_step = dict(points)
        series.append({"label": label, "values": [by_step.get(x) for x in xs]})
    return {"x": xs, "series": series}
