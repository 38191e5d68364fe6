"""Durable per-session state: offloaded payloads, archived history, checkpoints."""
