"""api keys, job owners, schedules and schedule runs

Jobs created before this migration get api_key_id NULL: no key owns them, so no key sees them through the API (they
stay in the database, and workers still finish them).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 09:00:00

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: Union[str, Sequence[str], None] = '0001'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('api_keys',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    op.create_table('schedules',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('api_key_id', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('cron', sa.String(length=128), nullable=False),
    sa.Column('timezone', sa.String(length=64), nullable=False),
    sa.Column('template', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('source', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('enabled', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_due_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_schedules_api_key_id_api_keys')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedules'))
    )
    op.create_index(op.f('ix_schedules_api_key_id_created_at'), 'schedules', ['api_key_id', 'created_at'],
                    unique=False)

    op.add_column('jobs', sa.Column('api_key_id', sa.BigInteger(), nullable=True))
    op.add_column('jobs', sa.Column('schedule_id', sa.UUID(), nullable=True))
    op.create_foreign_key(op.f('fk_jobs_api_key_id_api_keys'), 'jobs', 'api_keys', ['api_key_id'], ['id'])
    op.create_foreign_key(op.f('fk_jobs_schedule_id_schedules'), 'jobs', 'schedules', ['schedule_id'], ['id'],
                          ondelete='SET NULL')
    op.drop_constraint(op.f('uq_jobs_idempotency_key'), 'jobs', type_='unique')
    op.create_unique_constraint(op.f('uq_jobs_api_key_id_idempotency_key'), 'jobs',
                                ['api_key_id', 'idempotency_key'])
    op.drop_index(op.f('ix_jobs_created_at_id'), table_name='jobs')
    op.create_index(op.f('ix_jobs_api_key_id_created_at_id'), 'jobs', ['api_key_id', 'created_at', 'id'],
                    unique=False)

    op.create_table('schedule_runs',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('schedule_id', sa.UUID(), nullable=False),
    sa.Column('due_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.UUID(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_schedule_runs_job_id_jobs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], name=op.f('fk_schedule_runs_schedule_id_schedules'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedule_runs')),
    sa.UniqueConstraint('schedule_id', 'due_at', name=op.f('uq_schedule_runs_schedule_id_due_at'))
    )


def downgrade() -> None:
    op.drop_table('schedule_runs')
    op.drop_index(op.f('ix_jobs_api_key_id_created_at_id'), table_name='jobs')
    op.create_index(op.f('ix_jobs_created_at_id'), 'jobs', ['created_at', 'id'], unique=False)
    op.drop_constraint(op.f('uq_jobs_api_key_id_idempotency_key'), 'jobs', type_='unique')
    op.create_unique_constraint(op.f('uq_jobs_idempotency_key'), 'jobs', ['idempotency_key'])
    op.drop_constraint(op.f('fk_jobs_schedule_id_schedules'), 'jobs', type_='foreignkey')
    op.drop_constraint(op.f('fk_jobs_api_key_id_api_keys'), 'jobs', type_='foreignkey')
    op.drop_column('jobs', 'schedule_id')
    op.drop_column('jobs', 'api_key_id')
    op.drop_index(op.f('ix_schedules_api_key_id_created_at'), table_name='schedules')
    op.drop_table('schedules')
    op.drop_table('api_keys')
