"""What the control plane (broker) and the data plane (gateways) share, and nothing else: reason
codes and the exception tree, run-token claims and their verification, the Vault client, revocation
records and the one way to write them, the audit stream, settings read from the environment. It
imports neither plane."""
