"""Trials as jobs of the engine host: what a trial waits for or does now, its job there, a pending
cancel and its restarts after the host died (the columns a run has for the same purposes).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trial") as batch:
        batch.add_column(sa.Column("status_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("engine_job", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("trial") as batch:  # the default filled the rows there were; new rows get the model's
        batch.alter_column("cancel_requested", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("trial") as batch:
        for name in ("restarts", "cancel_requested", "engine_job", "status_reason"):
            batch.drop_column(name)
