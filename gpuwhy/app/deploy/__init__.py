"""Deployment helpers: what a host lacks to run gpuwhy (`gpuwhy check-env`) and the fix for each."""
