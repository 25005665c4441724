"""Every Redis key and channel valetkey uses, named in one place.

The same names serve one server, Sentinel and a Redis Cluster (``contract/redis_url.py``). On a
cluster a key lives in the hash slot of its ``{hash tag}`` (the part between the first braces), and
a Lua script, a ``MULTI`` or a pipeline that must read several keys together only works when they
share one slot. So every group of keys that is read or changed together carries one tag; keys used
alone carry none. On a single node the braces are just characters.

=====================================  ======================  ===========================================
key                                    slot                    used together by
=====================================  ======================  ===========================================
``{vk:rev}:revocations`` (hash)        ``{vk:rev}``            the broker's mint check (blocks + marker in
``{vk:rev}:generation`` (string)                               one read), the watchers' resync
``{vk:apr}:approval:<id>`` (hash)      ``{vk:apr}``            the approval scripts (create, decide,
``{vk:apr}:pending`` (sorted set)                              settle): record, pending set, run's set
``{vk:apr}:run:<run>`` (set)
``valetkey:budget:{<run>:<up>}:…``     one per run, upstream   the budget script (rate window, totals)
``valetkey:run:<id>``, the run index   spread                  alone
``valetkey:audit``, ``valetkey:alerts``  one each              alone (streams)
``valetkey:detect:<run>:…``            spread                  alone (one window per script call)
``valetkey:console:…``                 spread                  alone
=====================================  ======================  ===========================================

Channels are not keys: a classic ``PUBLISH`` reaches every node of a cluster, so the two channels
keep their names (a rolling upgrade keeps old and new replicas hearing each other).

Adding a key: name it here; if a script or transaction touches it with others, give it their tag.
Renaming one that holds state needs an upgrade path: the revocation hash and the marker moved
into ``{vk:rev}`` in session 5; a broker restoring revocations reads the hash under its old name
too (``broker/revocation_keeper.py``), and a missing marker is the data-loss path of
``contract/generation.py`` (see docs/operations.md, Redis Cluster).
"""

from __future__ import annotations

REVOCATION_SLOT = "{vk:rev}"
REVOCATIONS = f"{REVOCATION_SLOT}:revocations"
GENERATION = f"{REVOCATION_SLOT}:generation"
REVOCATION_CHANNEL = "valetkey:revocations"
LEGACY_REVOCATIONS = "valetkey:revocations"  # before session 5: read once when restoring

APPROVAL_SLOT = "{vk:apr}"
APPROVAL_PREFIX = f"{APPROVAL_SLOT}:approval:"
APPROVALS_PENDING = f"{APPROVAL_SLOT}:pending"
APPROVALS_RUN_PREFIX = f"{APPROVAL_SLOT}:run:"
APPROVAL_CHANNEL = "valetkey:approvals"

RUN_PREFIX = "valetkey:run:"
RUNS_BY_EXPIRY = "valetkey:runs:by_expiry"
AUDIT_STREAM = "valetkey:audit"
ALERTS_STREAM = "valetkey:alerts"
DETECT_PREFIX = "valetkey:detect:"
CONSOLE_SESSION_PREFIX = "valetkey:console:session:"
CONSOLE_CODE_PREFIX = "valetkey:console:code:"
CONSOLE_OIDC_STATE_PREFIX = "valetkey:console:oidc:"  # + sha256 of the OIDC state (10 minutes)
BUDGET_PREFIX = "valetkey:budget:"
ISSUED = "valetkey:issued"  # sha256 of each issued credential -> its expiry (gateways/sources/issued.py)


def budget(run: str, upstream: str) -> str:
    """The stem of a run's budget keys at one upstream (``…:rate:<purpose>``, ``…:requests``,
    ``…:bytes``), all in the slot of ``{run:upstream}``."""
    return f"{BUDGET_PREFIX}{{{run}:{upstream}}}"
