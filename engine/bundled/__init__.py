"""The bundled engine: prebake's own Llama-family engine on torch, in one folder.

adapter        its artifact kinds (autotune tactics, graphs: Dynamo precompile or an Inductor cache)
cache_layout   where its caches live in installed trees, and the environment that points torch at them
               (imports no torch)
build          the build child of `doit bake`: builds autotune or graphs with torch
start          the start-up: from a target to warm compiled steps, one logged step at a time
serve          `prebake serve`: listen first, start the engine, serve until a signal
runtime/       the model, its steps, scheduler and tokenizer on torch
api/           the OpenAI-compatible HTTP API on FastAPI
"""
