"""Routing policies: the API (base.py) and the built-ins (one file each)."""

from tracebench.policies.base import UNCAPPED, Assignment, Policy, QueuedRequest, ReportedLoad, ServerView

__all__ = ["UNCAPPED", "Assignment", "Policy", "QueuedRequest", "ReportedLoad", "ServerView"]
