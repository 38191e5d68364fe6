"""Control stages around the upstream call: fallback ⊃ retry ⊃ fit-to-context ⊃ upstream call.

classify.py   one table: upstream outcome → transient, overflow, logical, fatal
backoff.py    how long to wait before the next attempt (backoff with jitter, Retry-After)
retry.py      the proxy's one retry loop
fallback.py   the walk along an alias' fallback chain
circuit.py    circuit breakers per deployment
sessions.py   the circuit breaker per session
outcome.py    the errors control raises, and what every failure it returns carries
control.py    wires them together for one model call of a request
"""
