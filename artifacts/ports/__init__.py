"""The core's ports: what it needs from a registry, and the listing rows registries hand back.

    registry   the Registry protocol and its optional abilities (Maintainable, Listable), Published
    listing    what `prebake ls` shows of each bundle, and the listing summary that spares reading every entry

Declared here, implemented in prebake.registry: the core never imports a backend.
"""
