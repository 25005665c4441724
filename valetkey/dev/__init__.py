"""`valetkey dev`: the local stack (OpenBao, Redis, bootstrap, broker, gateways) and the demo
upstreams. For a laptop and the tests; never shipped as part of the product packages."""
