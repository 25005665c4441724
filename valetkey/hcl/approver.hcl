# An approver group's policy (the enterprise document's `approvers`): it only proves who its holder
# is to the broker, which then shows and lets decide that group's approvals; it reads nothing else.
path "auth/token/lookup-self" {
  capabilities = ["read"]
}
path "auth/token/renew-self" {
  capabilities = ["update"]
}
