"""jobs, items and item results

Revision ID: 0001
Revises: 
Create Date: 2026-12-02 13:52:38.815174

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = '0001'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table('jobs',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('type', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('metadata', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('idempotency_key', sa.String(length=255), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=True),
    sa.Column('total_items', sa.Integer(), nullable=False),
    sa.Column('completed_items', sa.Integer(), nullable=False),
    sa.Column('failed_items', sa.Integer(), nullable=False),
    sa.Column('cancelled_items', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('cancel_requested_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('new_tokens', sa.BigInteger(), nullable=False),
    sa.Column('target_forwards', sa.BigInteger(), nullable=False),
    sa.Column('rounds', sa.BigInteger(), nullable=False),
    sa.Column('accepted_tokens', sa.BigInteger(), nullable=False),
    sa.Column('decode_time_s', sa.Double(), nullable=False),
    sa.Column('sample_items', sa.Integer(), nullable=False),
    sa.Column('sample_new_tokens', sa.BigInteger(), nullable=False),
    sa.Column('sample_decode_time_s', sa.Double(), nullable=False),
    sa.Column('baseline_new_tokens', sa.BigInteger(), nullable=False),
    sa.Column('baseline_decode_time_s', sa.Double(), nullable=False),
    sa.CheckConstraint("status IN ('queued', 'running', 'completed', 'failed', 'cancelling', 'cancelled')", name=op.f('ck_jobs_status')),
    sa.CheckConstraint("type IN ('generation', 'review')", name=op.f('ck_jobs_type')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_jobs_idempotency_key'))
    )
    op.create_index(op.f('ix_jobs_created_at_id'), 'jobs', ['created_at', 'id'], unique=False)
    op.create_index(op.f('ix_jobs_status'), 'jobs', ['status'], unique=False)
    op.create_table('items',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=False),
    sa.Column('idx', sa.Integer(), nullable=False),
    sa.Column('custom_id', sa.String(length=256), nullable=False),
    sa.Column('prompt', sa.Text(), nullable=False),
    sa.Column('params', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('baseline_sample', sa.Boolean(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('queued', 'running', 'completed', 'failed', 'cancelled')", name=op.f('ck_items_status')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_items_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_items')),
    sa.UniqueConstraint('job_id', 'custom_id', name=op.f('uq_items_job_id_custom_id')),
    sa.UniqueConstraint('job_id', 'idx', name=op.f('uq_items_job_id_idx'))
    )
    op.create_index(op.f('ix_items_status_enqueued_at'), 'items', ['status', 'enqueued_at'], unique=False)
    op.create_table('item_results',
    sa.Column('item_id', sa.BigInteger(), nullable=False),
    sa.Column('output', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('stats', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    sa.Column('baseline_stats', postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('(output IS NULL) <> (error IS NULL)', name=op.f('ck_item_results_output_xor_error')),
    sa.ForeignKeyConstraint(['item_id'], ['items.id'], name=op.f('fk_item_results_item_id_items'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('item_id', name=op.f('pk_item_results'))
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('item_results')
    op.drop_index(op.f('ix_items_status_enqueued_at'), table_name='items')
    op.drop_table('items')
    op.drop_index(op.f('ix_jobs_status'), table_name='jobs')
    op.drop_index(op.f('ix_jobs_created_at_id'), table_name='jobs')
    op.drop_table('jobs')
