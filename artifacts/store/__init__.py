"""The local store: bundles fetched onto this machine, verified, unpacked, counted and bounded.

local   the store itself ($PREBAKE_HOME): install, hold, evict, index entries, file locks
admin   the operator's view: what is installed, whether it is whole, removing bundles
stats   hit, miss and fallback counts that persist in the store
"""
