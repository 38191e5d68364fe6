"""HTTP surfaces, one module each."""
