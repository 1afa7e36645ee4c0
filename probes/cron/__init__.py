"""Cron source: scheduled jobs and systemd timers, their runs, and the GPU actions they take."""
