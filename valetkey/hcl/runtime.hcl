# Base policy of a sandbox runtime (valetkey-runtime, and each runtime's own `vault_policy`).
# A runtime only proves who it is to the broker; it reads no secret and signs nothing.
path "auth/token/lookup-self" {
  capabilities = ["read"]
}
path "auth/token/renew-self" {
  capabilities = ["update"]
}
