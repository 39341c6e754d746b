"""Initial schema: spec, run, event, apitoken.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "apitoken",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        _ts("created_at"),
        _ts("last_used_at", nullable=True),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_apitoken")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_apitoken_token_hash")),
    )
    op.create_table(
        "spec",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_spec")),
    )
    op.create_index(op.f("ix_spec_name"), "spec", ["name"])
    op.create_table(
        "run",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("spec_id", sa.Integer(), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=True),
        sa.Column("retry_of", sa.Integer(), nullable=True),
        _ts("created_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("effective_attention", sa.JSON(), nullable=True),
        sa.Column("ray_job", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["retry_of"], ["run.id"], name=op.f("fk_run_retry_of_run"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["spec_id"], ["spec.id"], name=op.f("fk_run_spec_id_spec"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run")),
    )
    op.create_index(op.f("ix_run_created_at"), "run", ["created_at"])
    op.create_index(op.f("ix_run_name"), "run", ["name"])
    op.create_index(op.f("ix_run_spec_id"), "run", ["spec_id"])
    op.create_index(op.f("ix_run_status"), "run", ["status"])
    op.create_table(
        "event",
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        _ts("ts"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_event_run_id_run"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
        # Also the index behind "events of run R after seq N".
        sa.UniqueConstraint("run_id", "seq", name=op.f("uq_event_run_id_seq")),
    )


def downgrade() -> None:
    op.drop_table("event")
    for index in ("ix_run_status", "ix_run_spec_id", "ix_run_name", "ix_run_created_at"):
        op.drop_index(index, table_name="run")
    op.drop_table("run")
    op.drop_index("ix_spec_name", table_name="spec")
    op.drop_table("spec")
    op.drop_table("apitoken")
