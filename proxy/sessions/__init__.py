"""Sessions: which one a request belongs to and whose it is, which conversation it continues,
and what its last history lets the next turn reuse."""
