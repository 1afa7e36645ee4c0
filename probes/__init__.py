"""Event sources: eBPF probes (privileged), GPU counters, the kernel log and cron."""
