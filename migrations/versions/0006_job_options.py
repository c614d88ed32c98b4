"""job options: a job kind's own fields (jobs/kinds.py), e.g. a review job's labels and policy

Jobs from before this migration get {}: the kind's defaults (a review job: the built-in taxonomy).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 03:30:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0006'
down_revision: Union[str, Sequence[str], None] = '0005'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('options', postgresql.JSONB(astext_type=sa.Text()), nullable=False,
                                    server_default='{}'))


def downgrade() -> None:
    op.drop_column('jobs', 'options')
