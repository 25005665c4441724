# valetkey-run: policy of the per-run Vault tokens the broker creates through the token role.
# Such a token stands for one run; it may only look itself up.
path "auth/token/lookup-self" {
  capabilities = ["read"]
}
