"""Demo upstreams for ``valetkey dev`` and the end-to-end tests: local servers that behave like the
real APIs and accept only the real secret."""
