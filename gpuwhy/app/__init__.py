"""The applications: every command, the service wiring, checks, deploy and the demo harness.

They sit above the parts (probes, correlator, store, web view) and may import any of them;
no part imports them (docs/architecture.md, tests/test_layers.py). The demo harness
(:mod:`gpuwhy.app.demo`: scenarios, corpora, stand-in programs) is for tests, demos and the
evaluation, not for a production host.
"""
