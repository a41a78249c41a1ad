"""Reviewing what a registry holds: verify, promote, write-back and the quarantine's aging."""
