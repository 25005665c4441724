"""Which parameter and field names carry a credential, whatever the value looks like.

A value that matches no provider pattern (an internal service's key, a password) still must not
reach an upstream under a name like ``api_key``. This module is the one place those names live;
the gateway refuses a non-empty value under such a name (``gateways/fields.py``) and a purpose
may allow named ones back (``allow_fields`` in policy, checked at load against this list).

A name is compared by its *words*: split on every non-alphanumeric character and at camelCase
boundaries, folded to lower case; only ASCII letters and digits make words (other characters,
full-width letters included, separate words: no upstream reads them as ASCII). So ``api_key``,
``API-Key``, ``apiKey``, ``api%5Fkey`` (decoded by the caller) and ``user[api_key]`` all read as
``api key``. A name is credential-named when, in this order:

1. its joined words are in ``NOT_CREDENTIALS`` (pagination cursors, tokenizer special tokens…):
   no;
2. its joined words are in ``NAMES`` (or ``FLAT_NAMES`` for query and form parameters): yes;
3. its joined words end with a ``COMPOUND_SUFFIXES`` entry (``openaiapikey``, ``xapikey``): yes;
4. its last word is a ``WORD_SUFFIXES`` entry (``githubToken``, ``db_password``): yes.

Trailing numbers are no word of their own (``token2`` is ``token``).

Whole words only: ``max_tokens`` ends in the word ``tokens``, which is no rule, so it never
matches ``token``. ``key`` and ``signature`` alone count only as flat parameters (``?key=`` is
Google's API key; in JSON, ``{"key": …, "value": …}`` pairs and Anthropic's thinking-block
``signature`` are ordinary data).
"""

from __future__ import annotations

import re

NAMES = frozenset({
    "apikey", "apisecret", "apitoken", "accesstoken", "accesskey", "auth", "authorization",
    "authkey", "authtoken", "bearer", "clientsecret", "clientassertion", "credential",
    "credentials", "idtoken", "passphrase", "passwd", "password", "privatekey", "privatetoken",
    "pwd", "refreshtoken", "secret", "secretkey", "session", "sessionid", "sessionkey",
    "sessiontoken", "token", "xapikey",
})
FLAT_NAMES = frozenset({"key", "sig", "signature"})  # only as query, form or multipart names
COMPOUND_SUFFIXES = (
    "apikey", "apisecret", "apitoken", "accesstoken", "accesskey", "authtoken", "clientsecret",
    "idtoken", "passwd", "password", "privatekey", "privatetoken", "refreshtoken", "secretkey",
    "sessionid", "sessid", "sessiontoken",
)
WORD_SUFFIXES = frozenset({"token", "secret", "password", "passphrase", "credential", "credentials"})
NOT_CREDENTIALS = frozenset({
    # pagination and idempotency cursors named "...token"
    "pagetoken", "nextpagetoken", "prevpagetoken", "previouspagetoken", "continuationtoken",
    "synctoken", "resumetoken", "idempotencytoken", "clienttoken", "cursortoken",
    # tokenizer special tokens (text-generation parameters)
    "bostoken", "eostoken", "padtoken", "unktoken", "septoken", "clstoken", "masktoken",
    "stoptoken",
})
_CHUNK = re.compile(r"[A-Za-z0-9]+")
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]+")
_DROP_ASCII = str.maketrans("", "", "".join(c for c in map(chr, range(128)) if not c.isalnum()))
_WORD_ENDINGS = tuple(sorted(WORD_SUFFIXES))
MAX_NAME = 256  # longer names are no parameter an API documents: judged by their first 256 chars


def words(name: str) -> tuple[str, ...]:
    """``"openAI_API-Key2"`` → ``("open", "ai", "api", "key")``: trailing numbers dropped."""
    found = [w.lower() for chunk in _CHUNK.findall(name[:MAX_NAME]) for w in _WORD.findall(chunk)]
    while found and found[-1].isdigit():
        found.pop()
    return tuple(found)


def normalised(name: str) -> str:
    """The form names are compared in: words joined (``API-Key`` → ``apikey``). Words cover every
    letter and digit, so this is the letters and digits, lower-cased, trailing digits dropped."""
    name = name[:MAX_NAME]
    kept = name.translate(_DROP_ASCII) if name.isascii() else _NOT_ALNUM.sub("", name)
    return kept.lower().rstrip("0123456789")


# what a name's words can end with and still complete a credential name behind a parent's
# (``{"api": {"key": …}}``): every proper tail of NAMES and COMPOUND_SUFFIXES entries
_TAILS = frozenset(e[i:] for e in NAMES | set(COMPOUND_SUFFIXES) for i in range(1, len(e)))


def completes_a_name(name: str) -> bool:
    """Could ``name`` be the last part of a credential name split over two levels (``key`` of
    ``api`` → ``api_key``, ``id`` of ``session``)?"""
    return normalised(name) in _TAILS


def is_credential_name(name: str, flat: bool = False) -> bool:
    """Does ``name`` (already percent- or JSON-decoded) name a credential? ``flat``: a query,
    form or multipart parameter, where ``key`` and ``signature`` count too."""
    return credential_key(name, flat) is not None


def credential_key(name: str, flat: bool = False) -> str | None:
    """The normalised form of ``name`` if it names a credential (what ``allow_fields`` lists),
    else None. A few string operations in C: a JSON body may hold tens of thousands of names."""
    joined = normalised(name)
    if not joined or joined in NOT_CREDENTIALS:
        return None
    if (joined in NAMES or (flat and joined in FLAT_NAMES) or joined.endswith(COMPOUND_SUFFIXES)
            or (joined.endswith(_WORD_ENDINGS) and words(name)[-1] in WORD_SUFFIXES)):  # a whole word
        return joined
    return None
