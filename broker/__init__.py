"""valetkey control plane: authenticates runtimes, mints per-run tokens, serves JWKS."""
