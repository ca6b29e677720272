"""results gains an LLM job's facts as columns (schemas.llm_facts): its engine knobs as the server ran them
(JSON, n_threads filled in from the lease), the effective thread count, the tokenizer and the source of token
counts, and the workload (input/output token specs, shared prefix, seed, prompt file); job_results shows them

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 22:40:00.000000
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from farm.db.views import LLM_FACTS_0010, METRICS_0008, view_dropped

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

#: the columns added, with their types (frozen here: a later change of LlmFacts is a later migration)
COLUMNS = (
    ('knobs', sa.JSON()), ('n_threads', sa.Integer()), ('tokenizer', sa.Text()), ('token_source', sa.String(16)),
    ('input_tokens', sa.String(40)), ('output_tokens', sa.String(40)), ('prefix_tokens', sa.Integer()),
    ('workload_seed', sa.BigInteger()), ('prompts', sa.Text()),
)
assert tuple(name for name, _ in COLUMNS) == LLM_FACTS_0010


def upgrade() -> None:
    with view_dropped(op, METRICS_0008, LLM_FACTS_0010), op.batch_alter_table('results', schema=None) as batch_op:
        for name, kind in COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with view_dropped(op, METRICS_0008), op.batch_alter_table('results', schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
