"""A wrapper that keeps secret values out of reprs, logs and tracebacks."""

from __future__ import annotations

import hashlib
import hmac


class Secret:
    """Holds a secret string; ``str``/``repr``/format never show it. Use ``reveal()`` at the sink."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def fingerprint(self) -> str:
        """A short, non-reversible label (sha256 prefix) that is safe to log."""
        return hashlib.sha256(self._value.encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Secret values are not picklable")


def token_hash(token: str) -> str:
    """Cache key for a bearer credential: never key a cache by the raw token."""
    return hashlib.sha256(token.encode()).hexdigest()
