"""farm's API (issue 43): identities (API tokens, stored as sha256), the owner of each request submitted
through the API (fair share, read and write rules, the idempotency key), and the audit log. New tables only:
old workers and schedulers run beside it.

Revision ID: 0011_api
Revises: 0010
Create Date: 2026-11-28 21:00:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011_api'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'identities',
        sa.Column('name', sa.String(120), nullable=False),
        sa.Column('team', sa.String(120), nullable=True),
        sa.Column('admin', sa.Boolean(), nullable=False),
        sa.Column('priority', sa.Integer(), nullable=False),
        sa.Column('max_queued_jobs', sa.Integer(), nullable=True),
        sa.Column('max_running_jobs', sa.Integer(), nullable=True),
        sa.Column('max_request_jobs', sa.Integer(), nullable=True),
        sa.Column('token_sha256', sa.String(64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_identities')),
        sa.UniqueConstraint('token_sha256', name=op.f('uq_identities_token_sha256')),
    )
    op.create_table(
        'request_owners',
        sa.Column('request_id', sa.String(36), nullable=False),
        sa.Column('owner', sa.String(120), nullable=False),
        sa.Column('team', sa.String(120), nullable=True),
        sa.Column('priority', sa.Integer(), nullable=False),
        sa.Column('client_id', sa.String(64), nullable=True),
        sa.ForeignKeyConstraint(['request_id'], ['requests.id'], name=op.f('fk_request_owners_request_id_requests'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('request_id', name=op.f('pk_request_owners')),
    )
    op.create_index(op.f('ix_request_owners_owner'), 'request_owners', ['owner'])
    op.create_index(op.f('ix_request_owners_team'), 'request_owners', ['team'])
    op.create_table(
        'audit_log',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor', sa.String(120), nullable=False),
        sa.Column('action', sa.String(40), nullable=False),
        sa.Column('target', sa.String(200), nullable=True),
        sa.Column('detail', sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log')),
    )
    op.create_index(op.f('ix_audit_log_at'), 'audit_log', ['at'])


def downgrade() -> None:
    op.drop_index(op.f('ix_audit_log_at'), table_name='audit_log')
    op.drop_table('audit_log')
    op.drop_index(op.f('ix_request_owners_team'), table_name='request_owners')
    op.drop_index(op.f('ix_request_owners_owner'), table_name='request_owners')
    op.drop_table('request_owners')
    op.drop_table('identities')
