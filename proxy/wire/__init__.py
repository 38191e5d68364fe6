"""Per wire format: what a reply and a stream look like, and how errors are framed."""
