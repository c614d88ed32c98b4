"""item leases: the worker holding an item (lease_owner) and until when (lease_expires_at)

Items running before this migration have no lease; the reconciler treats them as before (re-sent once they have
been running longer than a batch may run).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 01:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.add_column('items', sa.Column('lease_owner', sa.String(length=128), nullable=True))
    op.add_column('items', sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index(op.f('ix_items_lease_expires_at'), 'items', ['lease_expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_items_lease_expires_at'), table_name='items')
    op.drop_column('items', 'lease_expires_at')
    op.drop_column('items', 'lease_owner')
