"""Trust in bundles, wherever they are stored: signing, policy, policy files, revocation, attestation.

Imports the core's port (prebake.artifacts.ports) and never a backend.
"""
