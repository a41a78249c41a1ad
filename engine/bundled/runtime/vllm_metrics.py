"""The series vLLM's /metrics exports, by vLLM's names, for the routers and load clients that read them.

Declared here and exported by runtime.metrics beside prebake's own; every series carries vLLM's
labels `model_name` (the served model) and `engine` ("0": one engine a server). Names, types and
buckets follow vLLM v1's PrometheusStatLogger (vllm/v1/metrics/loggers.py); where the figure
differs (no prefix cache, no preemption), docs/http-api.md ("Metrics") says how.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

# name -> (type, help, labels beyond LABELS, histogram buckets)
DECLARED: dict[str, tuple[type, str, tuple[str, ...], tuple[float, ...]]] = {
    "vllm:num_requests_running": (Gauge, "Number of requests in model execution batches.", (), ()),
    "vllm:num_requests_waiting": (Gauge, "Number of requests waiting to be processed.", (), ()),
    "vllm:kv_cache_usage_perc": (Gauge, "KV-cache usage. 1 means 100 percent usage.", (), ()),
    "vllm:gpu_cache_usage_perc": (Gauge, "KV-cache usage (vLLM's older name). 1 means 100 percent usage.", (), ()),
    "vllm:prefix_cache_queries_total": (
        Counter,
        "Prefix cache queries, in tokens (no prefix cache: prompt tokens).",
        (),
        (),
    ),
    "vllm:prefix_cache_hits_total": (Counter, "Prefix cache hits, in tokens (no prefix cache: 0).", (), ()),
    "vllm:gpu_prefix_cache_queries_total": (Counter, "Prefix cache queries, in tokens (vLLM's older name).", (), ()),
    "vllm:gpu_prefix_cache_hits_total": (Counter, "Prefix cache hits, in tokens (vLLM's older name).", (), ()),
    "vllm:gpu_prefix_cache_hit_rate": (
        Gauge,
        "Prefix cache hit rate (vLLM's older gauge; no prefix cache: 0).",
        (),
        (),
    ),
    "vllm:num_preemptions_total": (Counter, "Cumulative number of preemptions (this engine never preempts).", (), ()),
    "vllm:prompt_tokens_total": (Counter, "Number of prefill tokens processed.", (), ()),
    "vllm:generation_tokens_total": (Counter, "Number of generation tokens processed.", (), ()),
    "vllm:request_success_total": (Counter, "Count of finished requests, by finish reason.", ("finished_reason",), ()),
    "vllm:time_to_first_token_seconds": (Histogram, "Time to first token in seconds.", (), TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": (Histogram, "Inter-token latency in seconds.", (), ITL_BUCKETS),
    "vllm:request_time_per_output_token_seconds": (
        Histogram,
        "Time per output token of each request in seconds (its decode time over its tokens after the first).",
        (),
        ITL_BUCKETS,
    ),
    "vllm:e2e_request_latency_seconds": (Histogram, "End to end request latency in seconds.", (), E2E_BUCKETS),
    "vllm:request_prompt_tokens": (Histogram, "Number of prefill tokens processed, per request.", (), TOKEN_BUCKETS),
    "vllm:request_generation_tokens": (
        Histogram,
        "Number of generation tokens processed, per request.",
        (),
        TOKEN_BUCKETS,
    ),
}
