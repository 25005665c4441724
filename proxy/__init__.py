"""The egress proxy: the sandbox's one way out (``HTTPS_PROXY``), on the gateways' pipeline."""
