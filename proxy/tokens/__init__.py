"""Token counts the proxy acts on: estimates, exact counts near a decision, calibration."""
