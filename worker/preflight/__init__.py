"""Preflight: everything a launch would hit on its target, each with its key and a suggested value.

``preflight`` is pure: the caller gathers the facts that need I/O (``Facts``: the model folders and data
files as the engine would find them, the cluster's resources) and passes the preview of the spec."""

from worker.preflight.checks import Facts, Finding, Preflight, adapt_patch, preflight, resource_findings

__all__ = ["Facts", "Finding", "Preflight", "adapt_patch", "preflight", "resource_findings"]
