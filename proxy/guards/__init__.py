"""Guards that refuse a request before any work is done for it: rate limits."""
