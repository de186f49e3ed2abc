"""Serving: the long-running daemon (`daemon`, the composition root), the Unix socket server
speaking JSON lines (`server`), the APScheduler jobs (`scheduler`), optional push
replication (`replicate`), systemd notify/socket activation (`sdnotify`) and unit files
(`units`), and plain log lines (`logs`). Imports the engine and everything below it."""
