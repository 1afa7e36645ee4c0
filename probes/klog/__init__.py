"""Kernel-log source: NVIDIA Xid, SXid and NVRM lines from journald, /dev/kmsg or kern.log."""
