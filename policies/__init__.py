"""The valetkey policy language: versioned YAML validated completely at load."""

from policies.load import PolicyLoadError, load_policy_dir
from policies.model import PolicySet, Purpose, Runtime, Upstream
from policies.report import Problem

__all__ = [
    "PolicyLoadError",
    "PolicySet",
    "Problem",
    "Purpose",
    "Runtime",
    "Upstream",
    "load_policy_dir",
]
