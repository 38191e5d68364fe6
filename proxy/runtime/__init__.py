"""The process: serving a port, draining, workers, recycling, the C heap."""
