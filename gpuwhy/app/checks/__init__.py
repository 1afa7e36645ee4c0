"""Checks, baselines and reports for CI pipelines (`gpuwhy check`, `baseline`, `report`).

watch.py watches a process through the running service's store or a private pipeline;
expectations.py and baseline.py judge the window through the rules' signals (parser,
evaluator, StoreSignals); report.py, svg.py and pdf.py write the self-contained report.
"""
