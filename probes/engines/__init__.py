"""Inference-serving engines (vLLM, SGLang, TGI, Triton): found from /proc, their Prometheus
``/metrics`` scraped read-only on loopback, published as ``engine_sample`` events."""
