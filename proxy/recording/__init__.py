"""What the proxy did, made visible: notes, counters and the append-only event log."""
