"""Policy: YAML rule bundles compiled into first-match rules that decide new steps (§14).

Must not import the store, the services or the API.
"""

from rebuno.kernel.policy.engine import (
    PERMISSIVE,
    ApprovalConfig,
    Budget,
    Bundle,
    PolicyResult,
    RateLimit,
    bundle_error,
)
from rebuno.kernel.policy.loader import BundleCache, BundleInvalid, load_bundle

__all__ = [
    "PERMISSIVE",
    "ApprovalConfig",
    "Budget",
    "Bundle",
    "BundleCache",
    "BundleInvalid",
    "PolicyResult",
    "RateLimit",
    "bundle_error",
    "load_bundle",
]
