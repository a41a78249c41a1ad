"""doit tasks of prebake: wiring only; the logic lives in artifacts/, engine/ and registry/.

doit bake model=tiny-llama precision=bf16 [tp=1] [registry=PATH|file://|s3://|hf://]
doit list
"""

from doit import get_var

from prebake.artifacts.bake.tasks import BakeRequest, bake_tasks
from prebake.engine.compose import Context

DOIT_CONFIG = {
    "backend": "sqlite3",  # tolerates several doit processes sharing one dependency file
    "dep_file": ".doit.db",
    "default_tasks": [],
    "verbosity": 2,
}


def task_bake():
    """Bake a recipe for this host: buckets -> autotune -> graphs, each packed, published and installed.

    Variables: model=<recipe> precision=<dtype> tp=<N> registry=<address> (default: PREBAKE_REGISTRY,
    else the embedded registry in $PREBAKE_HOME/registry).
    """
    tp = get_var("tp", None)
    request = BakeRequest(
        model=get_var("model", None),
        precision=get_var("precision", None),
        tp=int(tp) if tp else None,
        registry=get_var("registry", None) or None,
    )
    yield from bake_tasks(request, open_baker=Context.open)
