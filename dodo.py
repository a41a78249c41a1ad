"""doit tasks of prebake: wiring only; the logic lives in artifacts/, engine/ and registry/.

doit bake model=tiny-llama precision=bf16 [tp=1] [registry=<address>]
doit help bake     the variables bake takes
doit list
"""

from prebake.artifacts.bake.tasks import doit_variables, variable_tasks
from prebake.engine.compose import Context

DOIT_CONFIG = {
    "backend": "sqlite3",  # tolerates several doit processes sharing one dependency file
    "dep_file": ".doit.db",
    "default_tasks": [],
    "verbosity": 2,
}


def task_bake():
    """Bake a recipe for this host: buckets -> autotune -> graphs, each packed, published and installed.

    Variables (checked: a misspelt one is refused): model=<recipe> precision=<dtype> tp=<N>
    registry=<address> (any form `prebake bake --help` lists; default: PREBAKE_REGISTRY, else the embedded registry in $PREBAKE_HOME/registry).
    """
    yield from variable_tasks(doit_variables(), open_baker=Context.for_baking)
