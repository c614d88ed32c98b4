"""items.messages: chat turns as an alternative to the bare prompt

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 09:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0003'
down_revision: Union[str, Sequence[str], None] = '0002'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.add_column('items', sa.Column('messages', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.alter_column('items', 'prompt', existing_type=sa.Text(), nullable=True)
    op.create_check_constraint(op.f('ck_items_prompt_xor_messages'), 'items',
                               '(prompt IS NULL) <> (messages IS NULL)')


def downgrade() -> None:
    # Chat items have no prompt to fall back to: they go with the column.
    op.execute("DELETE FROM items WHERE messages IS NOT NULL")
    op.drop_constraint(op.f('ck_items_prompt_xor_messages'), 'items', type_='check')
    op.alter_column('items', 'prompt', existing_type=sa.Text(), nullable=False)
    op.drop_column('items', 'messages')
