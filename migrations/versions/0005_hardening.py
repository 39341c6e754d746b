"""Hardening (issue 18): browser sessions kept server-side (logout ends them), and events that arrived with a seq
already stored under a different payload, kept and counted instead of silently dropped.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "browser_session",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["token_id"], ["apitoken.id"], name=op.f("fk_browser_session_token_id_apitoken"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_browser_session")),
        sa.UniqueConstraint("session_hash", name=op.f("uq_browser_session_session_hash")),
    )
    op.create_table(
        "event_conflict",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("stored_kind", sa.String(length=32), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_event_conflict_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_conflict")),
    )
    with op.batch_alter_table("event_conflict") as batch:
        batch.create_index(batch.f("ix_event_conflict_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("event_conflict") as batch:
        batch.drop_index(batch.f("ix_event_conflict_run_id"))
    op.drop_table("event_conflict")
    op.drop_table("browser_session")
