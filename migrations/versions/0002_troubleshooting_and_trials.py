"""Troubleshooting log (entries, notes, environment rechecks) and attention trials.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "troubleshootingentry",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=True),
        sa.Column("category", sa.String(length=48), nullable=False),
        sa.Column("implementation", sa.String(length=200), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("environment", sa.String(length=200), nullable=True),
        sa.Column("env", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("diagnosis", sa.JSON(), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["run_id"], ["run.id"], name=op.f("fk_troubleshootingentry_run_id_run"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_troubleshootingentry")),
        # One entry per event: ingestion is idempotent on (run_id, seq), and so is the log.
        sa.UniqueConstraint("run_id", "seq", name=op.f("uq_troubleshootingentry_run_id_seq")),
    )
    op.create_index(op.f("ix_troubleshootingentry_run_id"), "troubleshootingentry", ["run_id"])
    op.create_index(op.f("ix_troubleshootingentry_role"), "troubleshootingentry", ["role"])
    op.create_index(op.f("ix_troubleshootingentry_category"), "troubleshootingentry", ["category"])
    op.create_table(
        "troubleshootingnote",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("entry_id", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(length=200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(["entry_id"], ["troubleshootingentry.id"],
                                name=op.f("fk_troubleshootingnote_entry_id_troubleshootingentry"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_troubleshootingnote")),
    )
    op.create_index(op.f("ix_troubleshootingnote_entry_id"), "troubleshootingnote", ["entry_id"])
    op.create_table(
        "environmentrecheck",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("author", sa.String(length=200), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environmentrecheck")),
    )
    op.create_table(
        "trial",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("implementations", sa.JSON(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("author", sa.String(length=200), nullable=False),
        _ts("created_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trial")),
    )
    op.create_index(op.f("ix_trial_status"), "trial", ["status"])
    op.create_index(op.f("ix_trial_created_at"), "trial", ["created_at"])


def downgrade() -> None:
    for index in ("ix_trial_created_at", "ix_trial_status"):
        op.drop_index(index, table_name="trial")
    op.drop_table("trial")
    op.drop_table("environmentrecheck")
    op.drop_index("ix_troubleshootingnote_entry_id", table_name="troubleshootingnote")
    op.drop_table("troubleshootingnote")
    for index in ("ix_troubleshootingentry_category", "ix_troubleshootingentry_role", "ix_troubleshootingentry_run_id"):
        op.drop_index(index, table_name="troubleshootingentry")
    op.drop_table("troubleshootingentry")
