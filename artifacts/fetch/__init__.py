"""Fetching: the one pipeline every consumer runs, from keys to installed trees or explained misses.

pipeline   lookup -> verify -> bound -> install, time-boxed; one key's fetch; a run's stats
outcome    the values a run returns: Miss, Found, StoreRefused, Lookup, Resolution
gate       trust gating: an entry's key, a write-back awaiting review, the policy in force
explain    the nearest miss: the bundle of the same kind that differs in the fewest factors
mounted    trees already mounted (--mounted KIND=PATH), checked file by file and used in place
"""
