"""file storage and retention: a file's bytes may live in FILES_DIR (files.content NULL); indexes for the sweep

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 04:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: Union[str, Sequence[str], None] = '0006'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.alter_column('files', 'content', existing_type=sa.LargeBinary(), nullable=True)
    op.create_index(op.f('ix_files_expires_at'), 'files', ['expires_at'], unique=False)
    op.create_index(op.f('ix_batches_input_file_id'), 'batches', ['input_file_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_batches_input_file_id'), table_name='batches')
    op.drop_index(op.f('ix_files_expires_at'), table_name='files')
    # Files kept in FILES_DIR have no bytes in Postgres; the old schema cannot describe them.
    op.execute("DELETE FROM files WHERE content IS NULL")
    op.alter_column('files', 'content', existing_type=sa.LargeBinary(), nullable=False)
