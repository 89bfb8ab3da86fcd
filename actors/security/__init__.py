"""Dialog and transport security: certificates and keys (`certificates`), a dialog's session key
and the sealing of its messages (`sessions`). Plain Python on the `cryptography` package, no Ray."""
