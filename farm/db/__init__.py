"""farm's database: the ledger of requests, jobs, results, workers and model artifacts."""
from __future__ import annotations

from farm.db.models import Base, Job, ModelArtifact, Request, Result, Worker
from farm.db.session import dialect_insert, get_engine, session_scope

__all__ = ["Base", "Job", "ModelArtifact", "Request", "Result", "Worker", "dialect_insert", "get_engine",
           "session_scope"]
