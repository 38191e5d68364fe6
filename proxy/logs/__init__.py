"""The proxy's own log: lines a client cannot forge or flood, and repeats said once."""
