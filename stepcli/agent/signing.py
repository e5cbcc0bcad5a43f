"""Step logs are signed with the run's key, so the launcher trusts only files the run's own
processes wrote.

The key travels in STEPCLI_CONFIG, which only the run's processes inherit. Runs inside the target:
standard library only (hashlib and hmac are imported when a step log is written, not at start-up).
"""

from __future__ import annotations

import json

# typing is not imported at run time: this module loads in every profiled process
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def sign(key: str, document: dict[str, Any]) -> str:
    """HMAC-SHA256 of the document as `json.dumps` writes it compactly (a JSON round trip gives the
    same text)."""
    import hashlib
    import hmac

    payload = json.dumps(document, separators=(",", ":")).encode("ascii")
    return hmac.new(key.encode("utf-8"), payload, hashlib.sha256).hexdigest()


def signature_matches(key: str, document: dict[str, Any], signature: object) -> bool:
    import hmac

    return (
        bool(key)
        and isinstance(signature, str)
        and hmac.compare_digest(signature, sign(key, document))
    )
