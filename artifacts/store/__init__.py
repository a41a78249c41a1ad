"""The local store: bundles fetched onto this machine, verified, unpacked, counted and bounded.

local   the store itself ($PREBAKE_HOME), the one door; its jobs: settings, paths, install, leases,
        eviction (gc), recovery, scratch, volume (read-only, full, network filesystems)
admin   the operator's view: what is installed, whether it is whole, removing bundles
stats   hit, miss and fallback counts that persist in the store
"""
