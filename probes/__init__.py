"""Event sources: eBPF probes (privileged) and, later, GPU counters, kernel log and cron."""
