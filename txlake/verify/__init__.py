"""Anomaly checking of recorded histories (issue 20): :mod:`.history` records what clients
did and saw, :mod:`.checker` finds the anomalies, :mod:`.workload` runs workloads."""

from .checker import KINDS, Anomaly, check, summarize
from .history import Assign, FinalOffsets, FinalRead, History, OffsetCommit, Poll, Send, Txn

__all__ = ["KINDS", "Anomaly", "check", "summarize", "Assign", "FinalOffsets", "FinalRead", "History", "OffsetCommit",
           "Poll", "Send", "Txn"]
