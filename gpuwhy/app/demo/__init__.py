"""Harness, not product: demo scenarios, the stand-in GPU programs and synthetic hosts.

`gpuwhy demo`, the tests and the benchmarks use what is here; no product module imports it
(tests/test_layers.py checks that).
"""
