"""The tooling that composes valetkey: the `valetkey` command line, the Vault bootstrap with its HCL
templates, the sandbox self-test, and `valetkey.dev` (the local stack and its demo upstreams). No
product package (policies, contract, broker, gateways) imports it."""
