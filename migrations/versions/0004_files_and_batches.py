"""files and batches: the OpenAI-compatible /v1/files and /v1/batches (a batch runs as a job)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-05 10:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0004'
down_revision: Union[str, Sequence[str], None] = '0003'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('files',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('api_key_id', sa.BigInteger(), nullable=False),
    sa.Column('purpose', sa.String(length=32), nullable=False),
    sa.Column('filename', sa.String(length=256), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('content', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("purpose IN ('batch', 'batch_output')", name=op.f('ck_files_purpose')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_files_api_key_id_api_keys')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_files'))
    )
    op.create_index(op.f('ix_files_api_key_id_created_at_id'), 'files', ['api_key_id', 'created_at', 'id'], unique=False)
    op.create_table('batches',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('api_key_id', sa.BigInteger(), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('endpoint', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=True),
    sa.Column('input_file_id', sa.String(length=64), nullable=False),
    sa.Column('completion_window', sa.String(length=8), nullable=False),
    sa.Column('metadata', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    sa.Column('total_requests', sa.Integer(), nullable=False),
    sa.Column('line_errors', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('failed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('expired_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finalized_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('output_file_id', sa.String(length=64), nullable=True),
    sa.Column('error_file_id', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_batches_api_key_id_api_keys')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_batches_job_id_jobs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_batches'))
    )
    op.create_index(op.f('ix_batches_api_key_id_created_at_id'), 'batches', ['api_key_id', 'created_at', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_batches_api_key_id_created_at_id'), table_name='batches')
    op.drop_table('batches')
    op.drop_index(op.f('ix_files_api_key_id_created_at_id'), table_name='files')
    op.drop_table('files')
