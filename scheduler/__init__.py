"""Scheduler: expands requests into jobs (pure functions), applies compatibility rules, enqueues."""
from __future__ import annotations
